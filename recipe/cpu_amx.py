"""AMX tile permission for every vLLM process on a CPU that has AMX (Intel Sapphire Rapids and later).

Linux hands a process the AMX tile state only after the process asks for it (``arch_prctl(ARCH_REQ_XCOMP_PERM)``);
until then an AMX instruction raises SIGILL. PyTorch asks before its own oneDNN kernels use AMX, but vLLM CPU's
attention kernel (``cpu_attention_with_kv_cache``) uses AMX tiles without asking, so a process whose first AMX
instruction is vLLM's dies in its first forward (a bare engine: tests/integration/test_install.py). Registered as a
``vllm.general_plugins`` entry point, so vLLM calls :func:`register` in every process it starts, before any model runs.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform

import torch

logger = logging.getLogger(__name__)

ARCH_GET_XCOMP_PERM = 0x1022  # asm/prctl.h
XFEATURE_XTILEDATA = 18  # the AMX tile data state component
SYS_ARCH_PRCTL = 158  # x86_64


def amx_tiles_permitted() -> bool:
    """Whether this process may use AMX tile data now (Linux x86_64; False elsewhere)."""
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return False
    mask = ctypes.c_uint64(0)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(SYS_ARCH_PRCTL, ARCH_GET_XCOMP_PERM, ctypes.byref(mask)) != 0:
        return False
    return bool(mask.value >> XFEATURE_XTILEDATA & 1)


def register() -> None:
    """Ask Linux for AMX tile permission through PyTorch (a no-op returning False on CPUs without AMX)."""
    init_amx = getattr(torch._C._cpu, "_init_amx", None)
    if init_amx is None or platform.machine() != "x86_64":
        return
    if init_amx():
        logger.info("spec-rollout: AMX tile permission granted (pid %d) for vLLM CPU's AMX kernels", os.getpid())
