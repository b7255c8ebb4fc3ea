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


def test_a_value_of_the_wrong_type_is_one_line_naming_key_value_and_type(tmp_path):
    """Hydra takes ``abc`` for an integer key as a string; the run stops before any work with one line (the checks
    themselves, for every type: tests/unit/test_config.py)."""
    run = entry("trainer.total_training_steps=abc", f"trainer.default_local_dir={tmp_path / 'run'}")
    assert run.returncode == 2, run.stderr[-2000:]
    assert run.stderr.strip().splitlines() == ["error: trainer.total_training_steps: expected an integer, got 'abc'"]
    assert not (tmp_path / "run").exists()


def test_a_plus_key_nothing_reads_is_named_before_the_run_and_an_open_map_is_not(tmp_path):
    """``+`` adds keys, so Hydra takes a misspelled one silently: it is named in a warning before any work (the dry run
    stands for the work); a key under a map that veRL passes on whole (vLLM's engine kwargs) is not."""
    run = entry(
        "+trainer.totl_training_steps=3",
        "+actor_rollout_ref.rollout.engine_kwargs.vllm.max_num_batched_tokens=64",
        "backend=verl", "recipe.dry_run=true", f"trainer.default_local_dir={tmp_path / 'run'}",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    warnings = [line for line in run.stderr.splitlines() if line.startswith("warning: +")]
    assert warnings == [
        "warning: +trainer.totl_training_steps: no such key, and nothing reads it (a typo? without + a misspelled key "
        "is refused)"
    ]
    assert "max_num_batched_tokens: 64" in run.stdout  # the open map's key reached veRL's config


def test_an_unknown_spec_method_lists_the_methods():
    run = entry("spec=nope")
    assert run.returncode != 0
    assert "Could not find 'spec/nope'" in run.stderr and all(m in run.stderr for m in ("off", "sam", "mtp", "ngram"))
