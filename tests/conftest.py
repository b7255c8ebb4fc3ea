"""Shared fixtures: small base models built once per session (cached on disk by config hash)."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

REPO_ROOT = Path(__file__).resolve().parents[1]
TEST_CACHE = REPO_ROOT / "artifacts" / "test-cache"


def sft_config(**overrides):
    """The default SFT config with dotted-key overrides, cached under artifacts/test-cache."""
    cfg = OmegaConf.load(REPO_ROOT / "configs" / "sft.yaml")
    cfg.cache_dir = str(TEST_CACHE)
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value)
    return cfg


# the default output directories: configs/dapo.yaml's trainer.default_local_dir and the A/B's runs, and Hydra's
# default run directory, which the configs replace (a launch that wrote there would clutter the user's clone)
USER_OUTPUTS = (REPO_ROOT / "runs", REPO_ROOT / "outputs")


def _listing(root: Path) -> dict[str, int]:
    return {str(p): p.stat().st_mtime_ns for p in root.rglob("*")} if root.is_dir() else {}


@pytest.fixture(scope="session", autouse=True)
def users_outputs_are_left_alone():
    """No test writes the user's runs/ (or outputs/): ``make demo`` fills it before ``make test`` on a new clone, and a
    test that used the default run directory resumed from the demo's checkpoint there."""
    before = {root: _listing(root) for root in USER_OUTPUTS}
    yield
    for root in USER_OUTPUTS:
        changed = sorted(set(_listing(root).items()) ^ set(before[root].items()))
        assert not changed, f"tests wrote the user's {root}: {changed[:10]}"


@pytest.fixture(scope="session")
def harness_model() -> Path:
    """A briefly trained base model: knows the trace format, still uncertain (useful entropy for the
    sampling tests), repetitive enough for drafters to draft. About a minute to build."""
    from recipe.sft.train import ensure_base_model

    cfg = sft_config(**{"data.num_train": 4000, "data.num_test": 100, "train.steps": 120, "train.warmup_steps": 20})
    return ensure_base_model(cfg, progress=False)
