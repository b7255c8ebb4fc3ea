"""Base-model building: deterministic for a seed, cached by config hash, half-written caches rebuilt."""

import json

import torch
from conftest import sft_config
from safetensors.torch import load_file

from mtp.checkpoint import COMPLETE_MARKER
from recipe.sft.train import config_hash, ensure_base_model, train_base

TINY = {
    "data.num_train": 200,
    "data.num_test": 20,
    "train.steps": 3,
    "train.warmup_steps": 1,
    "train.tokens_per_step": 1024,
    "train.tokens_per_micro": 512,
    "model.hidden_size": 32,
    "model.intermediate_size": 64,
    "model.num_hidden_layers": 1,
}


def test_sft_is_deterministic_for_a_seed(tmp_path):
    cfg = sft_config(**TINY)
    a, b = train_base(cfg, tmp_path / "a", progress=False), train_base(cfg, tmp_path / "b", progress=False)
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    ha = (tmp_path / "a" / "sft_history.jsonl").read_text().splitlines()
    hb = (tmp_path / "b" / "sft_history.jsonl").read_text().splitlines()
    strip = lambda lines: [{k: v for k, v in json.loads(x).items() if k != "elapsed_s"} for x in lines]  # noqa: E731
    assert strip(ha) == strip(hb)
    assert (tmp_path / "a" / "sft_loss.png").stat().st_size > 0
    c = train_base(sft_config(**TINY, seed=1), tmp_path / "c", progress=False)
    wc = load_file(str(c / "model.safetensors"))
    assert not all(torch.equal(wa[k], wc[k]) for k in wa)


def test_cache_reuses_complete_and_rebuilds_half_written(tmp_path):
    cfg = sft_config(**TINY)
    cfg.cache_dir = str(tmp_path)
    ckpt = ensure_base_model(cfg, progress=False)
    assert ckpt.parent.name == config_hash(cfg)
    stamp = (ckpt / "model.safetensors").stat().st_mtime_ns
    assert ensure_base_model(cfg, progress=False) == ckpt
    assert (ckpt / "model.safetensors").stat().st_mtime_ns == stamp  # reused, not rebuilt
    (ckpt / COMPLETE_MARKER).unlink()  # as if the build died before finishing
    (ckpt / "model.safetensors").write_bytes(b"truncated")
    rebuilt = ensure_base_model(cfg, progress=False)
    assert (rebuilt / COMPLETE_MARKER).is_file()
    assert len(load_file(str(rebuilt / "model.safetensors"))) > 0


def test_config_hash_ignores_paths_but_not_training():
    a = sft_config(**TINY)
    b = sft_config(**TINY)
    b.cache_dir = "/elsewhere"
    c = sft_config(**{**TINY, "train.steps": 4})
    assert config_hash(a) == config_hash(b) != config_hash(c)


def test_the_cache_key_covers_the_code_that_builds_the_model(tmp_path):
    """Each file the base model's build runs is in the fingerprint: a changed byte in any gives another key."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    from recipe.sft.train import BUILD_SOURCES, REPO_ROOT, code_fingerprint

    for name in BUILD_SOURCES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO_ROOT / name, tmp_path / name)
    assert code_fingerprint(tmp_path) == code_fingerprint()
    # and every module of this project that the build imports is among them
    job = (
        "import sys, recipe.sft.train as t; "
        "print('\\n'.join(str(m.__file__) for m in list(sys.modules.values()) if getattr(m, '__file__', None)))"
    )
    files = subprocess.run([sys.executable, "-c", job], capture_output=True, text=True, check=True).stdout.split()
    imported = {
        str(Path(f).relative_to(REPO_ROOT)) for f in files if Path(f).is_relative_to(REPO_ROOT / "recipe")
        or Path(f).is_relative_to(REPO_ROOT / "mtp")
    }  # fmt: skip
    assert {f for f in imported if not f.endswith("__init__.py")} <= set(BUILD_SOURCES)
    for name in BUILD_SOURCES:
        original = (tmp_path / name).read_bytes()
        (tmp_path / name).write_bytes(original + b"\n")
        assert code_fingerprint(tmp_path) != code_fingerprint(), name
        (tmp_path / name).write_bytes(original)


def test_a_relative_cache_dir_is_the_checkouts_from_any_working_directory(tmp_path):
    """``python -m recipe.sft`` run from another directory, with the cache named relative (as configs/sft.yaml names
    its default), finds the base model already built under the checkout instead of building a second one there."""
    import subprocess
    import sys

    from conftest import REPO_ROOT, TEST_CACHE

    built = ensure_base_model(sft_config(**TINY), progress=False)  # under the absolute TEST_CACHE
    relative = TEST_CACHE.relative_to(REPO_ROOT)
    overrides = [f"{key}={value}" for key, value in TINY.items()]
    run = subprocess.run(
        [sys.executable, "-m", "recipe.sft", f"cache_dir={relative}", *overrides],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert f"base model: {built}" in run.stdout
    assert "reusing base model" in run.stderr + run.stdout
    assert not any(tmp_path.iterdir())  # nothing built or written where the command ran
