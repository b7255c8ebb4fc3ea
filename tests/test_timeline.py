"""Rollout timeline metrics on hand-made engine steps whose answers are worked out by hand."""

from __future__ import annotations

import pytest

from recipe.dapo.timeline import RolloutTimeline, speed_by_active_requests, step_rollout_metrics
from recipe.engine import SpecCounters


def timeline(steps: list[tuple[float, int, int, int]]) -> RolloutTimeline:
    """Steps of (duration s, active, stepped, tokens), back to back, no drafts."""
    tl = RolloutTimeline(num_requests=steps[0][1])
    t = 0.0
    for duration, active, stepped, tokens in steps:
        tl.step(t, duration, active, stepped, tokens, SpecCounters())
        t += duration
    return tl


def test_tail_throughput_and_per_request_speed():
    # 3 bulk steps of 16 requests, then a tail of 4 requests for 2 steps and 1 request for 2 steps
    tl = timeline([(0.01, 16, 16, 16)] * 3 + [(0.004, 4, 4, 8)] * 2 + [(0.002, 1, 1, 3)] * 2)
    s = tl.summary(tail_threshold=8)
    assert s["tokens"] == 3 * 16 + 2 * 8 + 2 * 3
    assert s["throughput_tok_s"] == pytest.approx(70 / 0.042)
    assert s["tail_throughput_tok_s"] == pytest.approx(22 / 0.012)
    # per active request: 22 tokens over 4 x 0.008 + 1 x 0.004 request-seconds
    assert s["tail_request_tok_s"] == pytest.approx(22 / 0.036)
    assert s["tail_time_share"] == pytest.approx(0.012 / 0.042)
    assert s["tail_tokens_per_request_step"] == pytest.approx(22 / 10)


def test_step_metrics_pool_rounds_by_time_not_by_round():
    quick = timeline([(0.001, 2, 2, 4)]).summary(8)  # 2000 tok/s per request over 0.002 request-s
    slow = timeline([(0.009, 1, 1, 1)]).summary(8)  # 111 tok/s over 0.009 request-s
    m = step_rollout_metrics([quick, slow])
    assert m["rollout/throughput_tok_s"] == pytest.approx(5 / 0.010)
    assert m["rollout/tail_throughput_tok_s"] == pytest.approx(5 / 0.010)
    assert m["rollout/tail_request_tok_s"] == pytest.approx(5 / 0.011)


def test_speed_by_active_requests_compares_equal_batch_sizes():
    # two rollouts: a straggler alone for 2 steps, 3 requests for 1 step, a full batch of 20 for 1 step
    a = timeline([(0.01, 20, 20, 40), (0.004, 3, 3, 6), (0.002, 1, 1, 2), (0.002, 1, 1, 3)])
    b = timeline([(0.005, 4, 4, 4)])
    bands = {r["active"]: r for r in speed_by_active_requests([a, b])}
    assert list(bands) == ["1", "2-4", "5-8", "9-16", "17-48", "49+"]
    assert bands["1"]["tok_s"] == pytest.approx(5 / 0.004)
    assert bands["1"]["tokens_per_request_step"] == pytest.approx(2.5)
    # 3 requests for 0.004 s and 4 for 0.005 s: 10 tokens over 0.032 request-seconds, 7 request-steps
    assert bands["2-4"]["request_tok_s"] == pytest.approx(10 / 0.032)
    assert bands["2-4"]["tok_s"] == pytest.approx(10 / 0.009)
    assert bands["2-4"]["tokens_per_request_step"] == pytest.approx(10 / 7)
    assert bands["17-48"]["time_share"] == pytest.approx(0.01 / 0.023)
    assert bands["5-8"]["time_share"] == 0 and bands["5-8"]["tok_s"] != bands["5-8"]["tok_s"]  # empty: NaN
    assert sum(r["time_share"] for r in bands.values()) == pytest.approx(1.0)
