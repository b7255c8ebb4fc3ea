"""The rollout replay (recipe/replay.py) against a step-by-step simulation written from its definition."""

from __future__ import annotations

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


def test_bands_and_lengths():
    assert [band_index(b) for b in (1, 2, 4, 5, 8, 9, 16, 17, 48, 49, 512)] == [0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    lengths = response_lengths(10_000, 8192, 1500, 1.0)
    assert lengths.min() >= 1 and lengths.max() == 8192 and 1300 < np.median(lengths) < 1700
