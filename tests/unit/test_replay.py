"""The rollout replay (recipe/replay.py) against a step-by-step simulation written from its definition."""

from __future__ import annotations

import csv
import gzip
import json
import subprocess
import sys

import numpy as np
import pytest

from recipe.replay import SPEC_OFF, Drafter, band_index, replay, response_lengths


def affine_cost(batch: int, contexts: np.ndarray, k: int) -> float:
    """A step cost of the cost model's form: fixed, per request, per context token, per drafted token."""
    return 1e-3 + 1e-4 * batch + 1e-7 * float(np.sum(contexts)) + 2e-4 * batch * k


def step_by_step(lengths, prompt, drafter, cost, max_num_seqs, tail=8) -> tuple[float, float, int]:
    waiting, active, seconds, tail_seconds, steps = list(lengths), [], 0.0, 0.0, 0
    while waiting or active:
        while waiting and len(active) < max_num_seqs:
            active.append([float(waiting.pop(0)), 0.0])
        batch = len(active)
        contexts = np.array([prompt + done for _, done in active])
        tokens, k = (drafter.tokens_at(batch), drafter.k) if drafter.k else (1.0, 0)
        if k and drafter.payoff and not tokens / cost(batch, contexts, k) > 1 / cost(batch, contexts, 0):
            tokens, k = 1.0, 0
        step = cost(batch, contexts, k)
        seconds += step
        tail_seconds += step if batch <= tail else 0.0
        steps += 1
        for request in active:
            request[1] += tokens
        active = [r for r in active if r[1] < r[0] - 1e-9]
    return seconds, tail_seconds, steps


@pytest.mark.parametrize("drafter", [SPEC_OFF, Drafter("every", 3, (2.0, 1.8, 1.6, 1.4, 1.2, 1.1), payoff=False),
                                     Drafter("payoff", 3, (2.0, 1.8, 1.6, 1.4, 1.2, 1.1))])  # fmt: skip
def test_replay_prices_a_rollout_as_a_step_by_step_simulation_does(drafter):
    lengths = [int(x) for x in response_lengths(40, 300, 60, 1.0, seed=3)]
    want_seconds, want_tail, want_steps = step_by_step(lengths, 50, drafter, affine_cost, max_num_seqs=16)
    got = replay(lengths, 50, drafter, affine_cost, max_num_seqs=16)
    assert got.seconds == pytest.approx(want_seconds, rel=1e-9)
    assert got.tail_seconds == pytest.approx(want_tail, rel=1e-9)
    assert got.steps == want_steps and got.tokens == sum(lengths)


def test_the_payoff_rule_drafts_only_where_drafts_pay():
    never = Drafter("weak", 3, (1.01,) * 6)  # 1% more tokens for far more than 1% more step time
    result = replay([100] * 32, 10, never, affine_cost, max_num_seqs=32)
    assert result.drafted_steps == 0
    assert result.seconds == pytest.approx(replay([100] * 32, 10, SPEC_OFF, affine_cost, max_num_seqs=32).seconds)
    always = Drafter("strong", 3, (3.5,) * 6)
    assert replay([100] * 2, 10, always, affine_cost, max_num_seqs=2).drafted_steps > 0  # verification is cheap at 2


def test_an_mtp_drafter_pays_its_heads_forward_only_on_steps_that_draft():
    """``recipe.bench replay``'s step cost for a head drafter (the hybrid): drafting adds the head's layer and LM
    head to a verify step; a step without drafts costs what spec off's does (the head does not run)."""
    from recipe.bench.replay import drafter_cost
    from recipe.cost_model import DEVICES, GPU_FIT, SHAPES, head_seconds, step_seconds

    shape, device = SHAPES["qwen3-8b"], DEVICES["h100"]
    hybrid = Drafter("hybrid", 1, (1.3,) * 6, head=True)
    cost = drafter_cost(shape, device, GPU_FIT, hybrid)
    contexts = np.full(4, 1024.0)
    assert cost(4, contexts, 0) == drafter_cost(shape, device, GPU_FIT, SPEC_OFF)(4, contexts, 0)
    assert cost(4, contexts, 1) == pytest.approx(
        step_seconds(shape, device, GPU_FIT, 4, contexts, 1) + head_seconds(shape, device, GPU_FIT, 4, contexts, 1)
    )
    assert cost(4, contexts, 1) > step_seconds(shape, device, GPU_FIT, 4, contexts, 1)


def test_the_real_models_drafters_are_read_at_their_deepest_chain(tmp_path):
    """``replay gpu`` carries SmolLM2's measured drafters to the GPU table: the head every step at its deepest chain
    (mtp/k4 beside mtp/k1), its draft tokens a step from what it verified, and the hybrid with the same head."""
    from recipe.bench.replay import measured_drafters

    path = tmp_path / "rollout_e2e.csv"
    path.write_text(
        "mode,k,tokens_per_request_step,draft_tokens_per_token\n"
        "off,0,1,0\nmtp/k1,1,1.28,0.78\nmtp/k4,4,1.73,2.3\nhybrid,6,1,0.001\noff#2,0,1,0\n"
    )
    mtp, hybrid = measured_drafters(path)
    assert (mtp.name, mtp.k, mtp.tokens_per_step[0], mtp.head, mtp.payoff) == ("mtp", 4, 1.73, True, False)
    assert (hybrid.name, hybrid.k, hybrid.tokens_per_step, hybrid.head, hybrid.payoff) == (
        "hybrid", 4, mtp.tokens_per_step, True, True)  # fmt: skip
    assert measured_drafters(tmp_path / "missing.csv") == []


def test_bands_and_lengths():
    assert [band_index(b) for b in (1, 2, 4, 5, 8, 9, 16, 17, 48, 49, 512)] == [0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    lengths = response_lengths(10_000, 8192, 1500, 1.0)
    assert lengths.min() >= 1 and lengths.max() == 8192 and 1300 < np.median(lengths) < 1700


def test_prefill_is_paid_once_per_admission_in_the_step_that_admits():
    cost = replay([50] * 4, 10, SPEC_OFF, affine_cost, max_num_seqs=2).seconds
    with_prefill = replay([50] * 4, 10, SPEC_OFF, affine_cost, max_num_seqs=2, prefill=lambda n: 0.5 * n)
    assert with_prefill.seconds == pytest.approx(cost + 0.5 * 4)


def test_the_cpu_replay_reads_a_recorded_rollout_and_writes_measured_beside_predicted(tmp_path):
    """``recipe.bench replay cpu`` on a timeline as ``recipe.bench rollout`` records it (RolloutTimeline.to_json in
    timelines.jsonl.gz): the measured seconds are the steps' durations, the prediction the replay's on the CPU fit."""
    from recipe.bench.replay import by_band, measured
    from recipe.dapo.timeline import RolloutTimeline
    from recipe.engine import SpecCounters

    spec = SpecCounters()
    timeline = RolloutTimeline(num_requests=2)
    timeline.step(0.0, 0.5, 2, 2, 2, spec, started=2)  # the prefill step
    for i in range(9):
        spec.num_drafts, spec.num_draft_tokens, spec.num_accepted_tokens = 2 * (i + 1), 2 * (i + 1), i + 1
        timeline.step(0.5 + 0.03 * i, 0.03, 2, 2, 3, spec)
    timeline.step(0.8, 0.02, 1, 1, 1, spec)
    timeline.finish("a", 19, 0.8)
    timeline.finish("b", 20, 0.82)
    tokens, drafts = by_band(timeline.to_json())
    assert tokens[1] == pytest.approx(27 / 18) and drafts[1] == pytest.approx(1.0) and tokens[0] == 1.0
    assert measured(timeline.to_json()) == pytest.approx(0.5 + 9 * 0.03 + 0.02)
    path = tmp_path / "timelines.jsonl.gz"
    with gzip.open(path, "wt") as fh:
        for mode in ("off", "suffix"):
            record = {"repeat": 0, "mode": mode, "k": 3, "n": 2, "prompt_tokens": [30], "timeline": timeline.to_json()}
            fh.write(json.dumps(record) + "\n")
    run = subprocess.run(
        [sys.executable, "-m", "recipe.bench", "replay", "cpu", "--whole", str(path), "--tail-run", str(path),
         "--out", str(tmp_path)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    rows = list(csv.DictReader(open(tmp_path / "replay_cpu.csv")))
    assert [(r["mode"], r["regime"]) for r in rows] == [("off", "whole"), ("suffix", "whole"), ("off", "tail"),
                                                        ("suffix", "tail")]  # fmt: skip
    whole = {r["mode"]: r for r in rows if r["regime"] == "whole"}
    assert float(whole["off"]["measured"]) == pytest.approx(0.79, rel=1e-3)
    # one scale fixed on spec off's whole rollouts: off predicted exactly there, and marked as fitted
    assert float(whole["off"]["predicted"]) == pytest.approx(0.79, rel=1e-3) and whole["off"]["fitted"] == "yes"
    assert {r["fitted"] for r in rows if r["mode"] != "off" or r["regime"] == "tail"} == {"no"}
    # the same responses in fewer steps, each verifying a draft: the prediction differs from spec off's
    assert float(whole["suffix"]["predicted"]) != pytest.approx(float(whole["off"]["predicted"]), rel=1e-3)


def test_a_missing_timelines_file_is_one_line(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "recipe.bench", "replay", "cpu", "--whole", str(tmp_path / "none.jsonl.gz")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert run.returncode == 2 and "no timelines at" in run.stderr.strip().splitlines()[-1]
