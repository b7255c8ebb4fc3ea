"""``python -m recipe.bench``: one entry point for every benchmark, listed with one line each, a bad name refused."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from recipe.bench import BENCHMARKS
from recipe.bench.__main__ import usage


def test_help_lists_every_benchmark_with_its_line():
    listed = subprocess.run([sys.executable, "-m", "recipe.bench", "--help"], capture_output=True, text=True)
    assert listed.returncode == 0
    for name, bench in BENCHMARKS.items():
        assert any(row.split() and row.split()[0] == name and bench.line in row for row in listed.stdout.splitlines())
    assert listed.stdout == usage()


@pytest.mark.parametrize("module", sorted({m for b in BENCHMARKS.values() for m in (b.module, b.gpu_module) if m}))
def test_every_benchmark_and_gpu_twin_is_a_module_with_a_main(module):
    module = importlib.import_module(f"recipe.bench.{module}")
    assert callable(module.main) and module.__doc__


def test_gpu_asked_of_a_benchmark_without_a_twin_is_one_line_and_exit_2():
    run = subprocess.run([sys.executable, "-m", "recipe.bench", "rollout", "--gpu"], capture_output=True, text=True)
    twins = ", ".join(n for n, b in BENCHMARKS.items() if b.gpu_module)
    assert run.returncode == 2 and run.stderr.strip().splitlines() == [
        f"error: rollout has no --gpu twin; those that do: {twins}"
    ]


def test_gpu_runs_the_twin_under_its_own_name():
    run = subprocess.run([sys.executable, "-m", "recipe.bench", "verify-cost", "--gpu", "--help"], capture_output=True,
                         text=True)  # fmt: skip
    assert run.returncode == 0 and "python -m recipe.bench verify-cost --gpu" in run.stdout and "--shape" in run.stdout


def test_an_unknown_benchmark_is_one_line_and_exit_2():
    run = subprocess.run([sys.executable, "-m", "recipe.bench", "rollouts"], capture_output=True, text=True)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [f"error: unknown benchmark 'rollouts'; known: {', '.join(BENCHMARKS)}"]


def test_a_benchmarks_own_options_are_its_own():
    run = subprocess.run([sys.executable, "-m", "recipe.bench", "cost-model", "--help"], capture_output=True, text=True)
    assert run.returncode == 0 and "python -m recipe.bench cost-model" in run.stdout and "--paper-device" in run.stdout


def test_the_benchmarks_own_proposers_are_named_where_vllm_can_import_them():
    """vLLM loads a ``custom_class`` proposer by its dotted path: the benchmarks' scripted drafters must name their
    module as Python imports it (a file stem broke them when the scripts moved into recipe/bench)."""
    from recipe.bench.rollout import engine_spec
    from recipe.bench.verify_cost import fixed_draft_spec

    for spec in (engine_spec("noop", 2), fixed_draft_spec(4), fixed_draft_spec("1of")):
        module, _, name = spec["model"].rpartition(".")
        assert callable(getattr(importlib.import_module(module), name)), spec


def test_verify_costs_long_prompts_are_cut_from_the_test_prompts_run_together():
    """``verify-cost --prompt-tokens N``: every request holds exactly N prompt tokens, each a different stretch of the
    test prompts' text, repeated where they run out."""
    from recipe.bench.verify_cost import long_prompts

    ids = [[1, 2, 3], [4, 5]]
    assert long_prompts(ids, 4, 3) == [[1, 2, 3, 4], [5, 1, 2, 3], [4, 5, 1, 2]]
