"""What a user sees on bad input to ``python -m recipe.dapo``: one line naming the key or file and what is wanted, exit
code 2, no traceback (``HYDRA_FULL_ERROR=1`` brings Hydra's traceback back), before any model is built."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def entry(*overrides: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "recipe.dapo", *overrides],
        cwd=REPO, env={**os.environ, **env}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("override", "named"),
    [
        (
            "actor_rollout_ref.rollout.n=0",
            "error: actor_rollout_ref.rollout.n: GRPO needs >= 2 samples per prompt, got 0",
        ),
        ("data.train_files={corrupt}", "error: data.train_files: {corrupt} is not a readable parquet file"),
    ],
)
def test_bad_input_is_one_line_naming_it_and_exit_code_2(override, named, tmp_path):
    corrupt = tmp_path / "corrupt.parquet"
    corrupt.write_bytes(b"not a parquet file")
    run = entry(override.format(corrupt=corrupt), f"trainer.default_local_dir={tmp_path / 'run'}")
    assert run.returncode == 2, run.stderr[-2000:]
    assert run.stderr.strip().splitlines()[-1].startswith(named.format(corrupt=corrupt)), run.stderr[-2000:]
    assert "Traceback" not in run.stderr
    assert not (tmp_path / "run").exists()  # nothing started


def test_hydra_full_error_shows_the_traceback(tmp_path):
    run = entry("actor_rollout_ref.rollout.n=0", f"trainer.default_local_dir={tmp_path}", HYDRA_FULL_ERROR="1")
    assert run.returncode == 1 and "Traceback" in run.stderr and "ConfigError" in run.stderr
