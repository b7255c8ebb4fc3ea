"""Lossless in training, tested as the A/B report reads it (recipe/ab/stats.py): paired per-step differences against
stated margins (TOST), on tables of cases built to fail the unpaired test the report used before."""

from __future__ import annotations

import math

import numpy as np
import pytest

from recipe.ab.render import lossless_markdown, verdict
from recipe.ab.stats import EQUIVALENCE_MARGINS, newey_west_se, paired_equivalence, tables

REWARD, LENGTH = "train/gen_score_mean", "response_length/mean"


def run(values: np.ndarray, key: str = REWARD, first_step: int = 1) -> list[dict]:
    return [{"step": first_step + i, key: float(v)} for i, v in enumerate(values)]


def trend(steps: int = 200, seed: int = 0, noise: float = 0.15) -> np.ndarray:
    """A reward that learns (a rising trend) and moves with each step's prompts, shared by both runs of a pair."""
    rng = np.random.default_rng(seed)
    return np.linspace(-0.6, 0.4, steps) + rng.normal(0.0, noise, steps)


def own_noise(steps: int = 200, seed: int = 1, scale: float = 0.03) -> np.ndarray:
    return np.random.default_rng(seed).normal(0.0, scale, steps)


@pytest.mark.parametrize(
    ("name", "shift", "expected"),
    [
        ("the same learning", 0.0, "equivalent"),
        ("a small shift inside the margin", 0.03, "equivalent"),
        ("a shift past the margin", 0.25, "differs"),
        ("a shift near the margin", 0.1, "not shown"),
    ],
)
def test_paired_steps_tell_the_verdict_against_the_margin(name, shift, expected):
    shared = trend()
    off, mode = run(shared), run(shared + shift + own_noise())
    result = paired_equivalence(mode, off, REWARD)
    assert result["verdict"] == expected, (name, result)
    assert result["low"] < result["difference"] < result["high"]
    assert result["difference"] == pytest.approx(shift, abs=0.01)


def test_a_shift_the_unpaired_test_missed_is_named_by_the_paired_one():
    """The report's old test, a permutation test of equal means over steps, cannot see a 0.15 shift under a trend of
    -0.6 to 0.4 (the steps' spread swamps it); pairing step by step removes the shared trend and shows it."""
    from scipy import stats

    shared = trend(steps=40)
    off, shifted = shared, shared + 0.15 + own_noise(steps=40)
    unpaired = stats.permutation_test(
        (shifted, off), lambda x, y, axis: x.mean(axis) - y.mean(axis), vectorized=True, n_resamples=5000, rng=0
    ).pvalue
    assert unpaired > 0.01  # the old report: "no change"
    assert paired_equivalence(run(shifted), run(off), REWARD)["verdict"] == "differs"


def test_length_is_read_relative_to_spec_offs_mean_and_steps_pair_by_number():
    """Lengths differ by 8% of spec off's mean at every step (margin 10%): the difference is read as -0.08; a step
    only one run logged (a relaunch's extra step) is left out."""
    margin, relative = EQUIVALENCE_MARGINS[LENGTH]
    assert relative and margin == 0.1
    off_lengths = 300 + 50 * np.sin(np.arange(60) / 5)
    off = run(off_lengths, LENGTH)
    mode = run(off_lengths - 0.08 * off_lengths.mean() + own_noise(60, scale=1.0), LENGTH) + [{"step": 61, LENGTH: 9e9}]
    result = paired_equivalence(mode, off, LENGTH)
    assert result["difference"] == pytest.approx(-0.08, abs=0.005)
    assert result["verdict"] == "equivalent"


def test_correlated_steps_widen_the_interval():
    """A series whose steps come in equal pairs holds half the information of its length: the Newey-West error is
    larger than the i.i.d. one, and an interval built on the i.i.d. one would call noise equivalence."""
    rng = np.random.default_rng(0)
    iid = rng.normal(0.0, 1.0, 400)
    paired = np.repeat(rng.normal(0.0, 1.0, 200), 2)
    naive = paired.std(ddof=1) / math.sqrt(paired.size)
    assert newey_west_se(paired) > 1.25 * naive
    assert newey_west_se(iid) == pytest.approx(iid.std() / math.sqrt(iid.size), rel=0.15)


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ({"score_verdict": "equivalent", "length_verdict": "equivalent", "a_greedy_p": 0.5}, "yes"),
        ({"score_verdict": "equivalent", "length_verdict": "not shown", "a_greedy_p": 0.5}, "not shown"),
        ({"score_verdict": "differs", "length_verdict": "equivalent", "a_greedy_p": 0.5}, "NO"),
        ({"score_verdict": "equivalent", "length_verdict": "equivalent", "a_greedy_p": 0.001}, "NO"),
    ],
)
def test_the_reports_verdict_needs_both_equivalences_and_no_accuracy_difference(row, expected):
    assert verdict(row) == expected


def test_the_report_states_the_margins_and_each_modes_interval():
    shared = trend(steps=50)
    runs = {"off": run(shared), "sam": run(shared + own_noise(50)), "bad": run(shared + 0.4)}
    for h, values in ((runs["off"], shared), (runs["sam"], shared), (runs["bad"], shared)):
        for row, v in zip(h, values, strict=True):
            row[LENGTH] = 200 + 10 * v
    rows = tables(runs, val_n=64)["lossless"]
    text = "\n".join(lossless_markdown(rows))
    assert "±0.1" in text and "±10% of spec off's mean" in text
    by_mode = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ")}
    assert by_mode["sam"].rstrip(" |").endswith("yes") and by_mode["bad"].rstrip(" |").endswith("NO")
