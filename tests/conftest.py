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


@pytest.fixture(scope="session")
def harness_model() -> Path:
    """A briefly trained base model: knows the trace format, still uncertain (useful entropy for the
    sampling tests), repetitive enough for drafters to draft. About a minute to build."""
    from recipe.sft.train import ensure_base_model

    cfg = sft_config(**{"data.num_train": 4000, "data.num_test": 100, "train.steps": 120, "train.warmup_steps": 20})
    return ensure_base_model(cfg, progress=False)
