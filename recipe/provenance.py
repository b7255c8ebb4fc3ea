"""Where a result came from, for the reports that write results/: the machine (CPU model, cores, the vector ISA that
decides CPU kernels' speed, the GPU if any) and the checkout's commit."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

from recipe.paths import REPO_ROOT

ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")  # what vLLM CPU's and torch's kernels use


def machine() -> str:
    """``<CPU model>, <n> cores, <ISA flags>[, <GPU>]`` of this machine."""
    model, flags = platform.processor() or platform.machine(), set()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    isa = "/".join(f for f in ISA_FLAGS if f in flags) or "no AVX2"
    text = f"{model}, {os.cpu_count()} cores, {isa}"
    try:
        import torch

        if torch.cuda.is_available():
            text += f", {torch.cuda.get_device_name()}"
    except ImportError:
        pass
    return text


def commit() -> str:
    """The checkout's short commit, ``+changes`` when tracked files differ from it; ``unknown`` outside git."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=REPO_ROOT).returncode != 0
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+changes" if dirty else "")
