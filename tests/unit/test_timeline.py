"""Rollout timeline metrics on hand-made engine steps whose answers are worked out by hand."""

from __future__ import annotations

import pytest

from recipe.dapo.timeline import (
    RolloutTimeline,
    accept_rates_by_depth,
    speed_by_active_requests,
    speed_by_active_requests_vs_off,
    step_rollout_metrics,
)
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


def test_decode_throughput_leaves_out_the_steps_that_prefilled_a_request(tmp_path):
    """A drafter changes only the steps that prefill nothing; on a CPU the prefill steps of short responses can hold
    most of a rollout's time, and the same prompts cost both sides of an A/B the same there."""
    tl = RolloutTimeline(num_requests=3)
    # (duration, active, stepped, tokens, started): two prefill steps (the second also decodes), then three decodes
    steps = [(0.5, 3, 2, 2, 2), (0.4, 3, 3, 4, 1), (0.02, 3, 3, 5, 0), (0.02, 2, 2, 3, 0), (0.01, 1, 1, 2, 0)]
    t = 0.0
    for duration, active, stepped, tokens, started in steps:
        tl.step(t, duration, active, stepped, tokens, SpecCounters(), started)
        t += duration
    tl.save(tmp_path / "round.json")
    s = RolloutTimeline.load(tmp_path / "round.json").summary(tail_threshold=8)
    assert s["decode_throughput_tok_s"] == pytest.approx(10 / 0.05)
    assert s["prefill_time_share"] == pytest.approx(0.9 / 0.95)
    assert s["throughput_tok_s"] == pytest.approx(16 / 0.95)
    # pooled over rounds as every other ratio: a round of decodes alone adds to the decode time only
    decodes = timeline([(0.05, 2, 2, 6)]).summary(8)
    m = step_rollout_metrics([s, decodes])
    assert m["rollout/decode_throughput_tok_s"] == pytest.approx(16 / 0.10)
    assert m["rollout/prefill_time_share"] == pytest.approx(0.9 / 1.0)
    # by band of active requests: the 2-4 band holds one prefill step, which decode_only leaves out
    whole = {r["active"]: r for r in speed_by_active_requests([tl])}
    decode = {r["active"]: r for r in speed_by_active_requests([tl], decode_only=True)}
    assert whole["2-4"]["tok_s"] == pytest.approx(14 / 0.94)
    assert decode["2-4"]["tok_s"] == pytest.approx(8 / 0.04)
    assert decode["1"]["tok_s"] == whole["1"]["tok_s"] == pytest.approx(2 / 0.01)


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


def test_speed_by_active_requests_vs_off_divides_band_by_band():
    off = timeline([(0.01, 20, 20, 20), (0.002, 1, 1, 1)])  # 100 tok/s per request in 17-48, 500 alone
    spec = [timeline([(0.01, 20, 20, 40), (0.004, 1, 1, 3)]), timeline([(0.004, 1, 1, 3)])]  # 200, 750
    rows = {(r["mode"], r["active"]): r for r in speed_by_active_requests_vs_off({"off": [off], "sam": spec})}
    assert rows[("sam", "17-48")]["request_tok_s_vs_off"] == pytest.approx(2.0)
    assert rows[("sam", "1")]["request_tok_s_vs_off"] == pytest.approx(1.5)
    assert rows[("off", "1")]["request_tok_s_vs_off"] == pytest.approx(1.0)
    assert rows[("sam", "2-4")]["request_tok_s_vs_off"] != rows[("sam", "2-4")]["request_tok_s_vs_off"]  # empty: NaN
    without_off = speed_by_active_requests_vs_off({"sam": spec})
    assert all(r["request_tok_s_vs_off"] != r["request_tok_s_vs_off"] for r in without_off)


def drafting_timeline(steps: list[tuple[float, int, int, int, int, int]]) -> RolloutTimeline:
    """Steps of (duration s, active, stepped, tokens, drafts, accepted tokens), 3 draft tokens per draft."""
    tl = RolloutTimeline(num_requests=steps[0][1])
    t, total = 0.0, [0, 0, 0]
    for duration, active, stepped, tokens, drafts, accepted in steps:
        total = [total[0] + drafts, total[1] + 3 * drafts, total[2] + accepted]
        tl.step(t, duration, active, stepped, tokens, SpecCounters(*total))
        t += duration
    return tl


def test_accepted_drafts_of_a_responses_last_token_earn_nothing():
    """Two requests draft 3 tokens a step. Step 1: each accepts 2 and emits 3. Step 2: one accepts 1 and emits 2; the
    other accepts its draft of EOS and ends, emitting the EOS alone (its step would have emitted it anyway, and the
    bonus token after it is cut off). vLLM counts 6 of 12 drafts accepted; 5 of them added a token."""
    tl = drafting_timeline([(0.01, 2, 2, 6, 2, 4), (0.01, 2, 2, 3, 2, 2)])
    s = tl.summary(8)
    assert s["spec_draft_acceptance_rate"] == pytest.approx(6 / 12)
    assert s["spec_draft_earned_rate"] == pytest.approx(5 / 12)
    assert s["tokens_per_request_step"] == pytest.approx(1 + 5 / 4)
    assert timeline([(0.01, 2, 2, 2)]).summary(8)["spec_draft_earned_rate"] == 0.0  # spec off: no drafts


def test_step_metrics_pool_counts_over_rounds_and_leave_out_a_missing_tail():
    # round 1 ends with 12 requests finishing in one step: no step at or below 8 active, no tail
    no_tail = drafting_timeline([(0.01, 20, 20, 60, 20, 40), (0.01, 12, 12, 24, 12, 12)]).summary(8)
    assert no_tail["tail_time_share"] == 0
    assert all(no_tail[k] != no_tail[k] for k in ("tail_throughput_tok_s", "tail_tokens_per_request_step"))  # NaN
    # round 2: a short round with a tail of 2 requests
    with_tail = drafting_timeline([(0.004, 9, 9, 18, 9, 9), (0.002, 2, 2, 8, 2, 6)]).summary(8)
    m = step_rollout_metrics([no_tail, with_tail])
    # pooled over the step's request-steps and drafts, not a mean of the rounds' ratios
    assert m["rollout/tokens_per_request_step"] == pytest.approx((60 + 24 + 18 + 8) / (20 + 12 + 9 + 2))
    assert m["rollout/spec_accept_length"] == pytest.approx(1 + (40 + 12 + 9 + 6) / (20 + 12 + 9 + 2))
    assert m["rollout/spec_draft_acceptance_rate"] == pytest.approx((40 + 12 + 9 + 6) / (3 * 43))
    # the tail is round 2's alone; round 1 adds no zero to it
    assert m["rollout/tail_throughput_tok_s"] == pytest.approx(8 / 0.002)
    assert m["rollout/tail_tokens_per_request_step"] == pytest.approx(4.0)
    assert m["rollout/tail_spec_accept_length"] == pytest.approx(1 + 6 / 2)
    assert m["rollout/tail_time_share"] == pytest.approx(0.002 / 0.026)
    # a step with no tail in any round logs no tail ratios (a mean over steps skips it), only the zero share
    alone = step_rollout_metrics([no_tail])
    assert alone["rollout/tail_time_share"] == 0
    assert not [k for k in alone if "tail" in k and "share" not in k]


def test_the_drafters_time_pools_over_rounds_and_is_left_out_without_a_sam_drafter(tmp_path):
    first = drafting_timeline([(0.01, 20, 20, 60, 20, 40), (0.01, 12, 12, 24, 12, 12)])
    second = drafting_timeline([(0.004, 9, 9, 18, 9, 9), (0.002, 2, 2, 8, 2, 6)])
    first.drafter_s, second.drafter_s = 0.002, 0.0012
    first.save(tmp_path / "round.json")
    m = step_rollout_metrics([RolloutTimeline.load(tmp_path / "round.json").summary(8), second.summary(8)])
    assert m["rollout/drafter_time_share"] == pytest.approx(0.0032 / 0.026)
    # one round without the drafter's time (another drafter) leaves the step without the metric, not at a share
    # of part of its time
    plain = step_rollout_metrics([drafting_timeline([(0.01, 20, 20, 60, 20, 40)]).summary(8), second.summary(8)])
    assert not [k for k in plain if k.startswith("rollout/drafter")]


def server_row(t: float, dt: float, active: int, left: int, tokens: int, drafts=0, accepted=0, finished=(), started=0):
    return {"t": t, "dt": dt, "active": active, "tokens": tokens, "drafts": drafts,
            "draft_tokens": 2 * drafts, "accepted_tokens": accepted, "finished": [list(f) for f in finished],
            "drained": left == 0, "started": started}  # fmt: skip


def test_server_rows_are_assigned_to_steps_by_the_tracking_marks_and_validation_is_left_out(tmp_path):
    """One server: step 1 has a training rollout (two steps of 2 requests, 7 tokens, 2 drafts with 3 accepted)
    then a validation rollout; step 2 a training rollout after a relaunch. Rows of a killed launch's step 2 are
    replaced by the relaunch's. A step's requests that emitted tokens are its tokens less its accepted drafts."""
    import json

    from recipe.dapo.server_timeline import rollout_metrics_by_step
    from recipe.dapo.step_marks import STEP_MARKS

    rows = [
        server_row(10.0, 0.0, 2, 2, 3, drafts=1, accepted=1, started=2),
        server_row(10.5, 0.5, 2, 0, 4, drafts=1, accepted=2, finished=[("a", 4), ("b", 3)]),
        server_row(11.0, 0.0, 1, 0, 1, finished=[("v", 1)], started=1),  # validation of step 1
        server_row(30.0, 0.0, 1, 0, 3, drafts=1, accepted=2, finished=[("c", 3)], started=1),  # relaunch, step 2
    ]
    (tmp_path / "server_timeline").mkdir()
    (tmp_path / "server_timeline" / "engine-h-1-0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    marks = [{"step": 0, "t": 9.0, "launch": 5.0, "resumed_from": 0}, {"step": 1, "t": 12.0, "launch": 5.0, "resumed_from": 0},
             {"step": 2, "t": 14.0, "launch": 5.0, "resumed_from": 0},  # the killed launch's step 2
             {"step": 1, "t": 25.0, "launch": 20.0, "resumed_from": 1}, {"step": 2, "t": 31.0, "launch": 20.0, "resumed_from": 1}]  # fmt: skip
    (tmp_path / STEP_MARKS).write_text("".join(json.dumps(m) + "\n" for m in marks))
    metrics = rollout_metrics_by_step(tmp_path, validated={0, 1}, tail_threshold=8)
    assert sorted(metrics) == [1, 2]
    assert metrics[1]["rollout/throughput_tok_s"] == pytest.approx(7 / 0.5)
    assert metrics[1]["rollout/spec_accept_length"] == pytest.approx(1 + 3 / 2)
    assert metrics[1]["rollout/tokens_per_request_step"] == pytest.approx(7 / 4)
    assert metrics[1]["rollout/decode_throughput_tok_s"] == pytest.approx(4 / 0.5)  # the first row prefilled both
    assert "rollout/spec_accept_length" in metrics[2] and metrics[2]["rollout/tokens_per_request_step"] == 3.0
    assert sorted(p.name for p in (tmp_path / "timelines").iterdir()) == [
        "step_00001_server0_round_1.json",
        "step_00002_server0_round_1.json",
    ]


def test_saved_timelines_reads_both_backends_names_by_step(tmp_path):
    """The A/B reads the timelines of either backend: the local loop's one file per round and veRL's one per server and
    round (it used to glob only the local names, and a backend=verl A/B got an empty table)."""
    from recipe.dapo.timeline import saved_timelines, timeline_path

    written = [
        timeline_path(tmp_path, 2, 1),
        timeline_path(tmp_path, 1, 2),
        timeline_path(tmp_path, 1, 1),
        timeline_path(tmp_path, 3, 1, server=1),
        timeline_path(tmp_path, 3, 2, server=0),
        timeline_path(tmp_path, 3, 1, server=0),
    ]
    for path in written:
        path.write_text("{}")
    (tmp_path / "step_notes.json").write_text("{}")
    found = {step: [p.name for p in paths] for step, paths in saved_timelines(tmp_path).items()}
    assert found == {
        1: ["step_00001_round_1.json", "step_00001_round_2.json"],
        2: ["step_00002_round_1.json"],
        3: ["step_00003_server0_round_1.json", "step_00003_server0_round_2.json", "step_00003_server1_round_1.json"],
    }


def test_equal_work_ratio_runs_each_mode_at_spec_offs_mix_of_batch_sizes():
    """Off spends half its time in each of two bands; a mode twice as fast per request in the first and as fast in the
    second does off's work in 0.25 + 0.5 of off's time: 1.33x. A band off spends time in and the mode never reached
    makes the ratio unknown (NaN), not a flattering number."""
    import math

    from recipe.dapo.timeline import equal_work_vs_off

    def band(mode, share, vs_off):
        return {"mode": mode, "time_share": share, "request_tok_s_vs_off": vs_off}

    bands = [band("off", 0.5, 1.0), band("off", 0.5, 1.0), band("off", 0.0, math.nan)]
    bands += [band("sam", 0.3, 2.0), band("sam", 0.6, 1.0), band("sam", 0.1, 3.0)]
    bands += [band("gap", 1.0, 1.0), band("gap", 0.0, math.nan), band("gap", 0.0, math.nan)]
    ratios = equal_work_vs_off(bands)
    assert ratios["off"] == 1.0
    assert ratios["sam"] == pytest.approx(1 / 0.75)
    assert math.isnan(ratios["gap"])
    assert equal_work_vs_off([band("sam", 1.0, 1.0)]) == {}


@pytest.mark.parametrize(
    ("counts", "expected"),
    [
        # 100 three-token drafts: 60 accepted at depth 1, 30 at 2, 24 at 3
        ({"drafts": 100, "accepted_pos_1": 60, "accepted_pos_2": 30, "accepted_pos_3": 24}, [0.6, 0.5, 0.8]),
        # nothing accepted at depth 1: depth 2 was never reached
        ({"drafts": 10, "accepted_pos_1": 0, "accepted_pos_2": 0}, [0.0, float("nan")]),
        ({"drafts": 0}, []),
    ],
)
def test_accept_rate_by_depth_is_conditional_on_the_depths_before(counts, expected):
    rates = accept_rates_by_depth(counts)
    assert list(rates) == [f"accept_rate_pos_{k}" for k in range(1, len(expected) + 1)]
    assert list(rates.values()) == pytest.approx(expected, nan_ok=True)


def test_per_depth_counts_go_from_the_engines_cumulative_counters_to_steps_rounds_and_metrics(tmp_path):
    """The engine's counters are cumulative and grow a depth when K does; each step keeps its own deltas, a saved
    timeline reads back the same, and a training step's metrics pool its rounds' counts before dividing."""
    tl = RolloutTimeline(num_requests=2)
    tl.step(0.0, 0.1, 2, 2, 5, SpecCounters(2, 6, 3, (2, 1)))
    tl.step(0.1, 0.1, 2, 2, 6, SpecCounters(4, 12, 7, (4, 2, 1)))
    assert [s.accepted_per_pos for s in tl.steps] == [[2, 1], [2, 1, 1]]
    tl.save(tmp_path / "t.json")
    again = RolloutTimeline.load(tmp_path / "t.json")
    assert again.arrays()["accepted_per_pos"].tolist() == [[2, 1, 0], [2, 1, 1]]
    s = again.summary(8)
    assert (s["accepted_pos_1"], s["accepted_pos_2"], s["accepted_pos_3"]) == (4, 2, 1)
    assert (s["accept_rate_pos_1"], s["accept_rate_pos_2"], s["accept_rate_pos_3"]) == (1.0, 0.5, 0.5)
    other = timeline([(0.1, 1, 1, 1)])
    other.step(0.1, 0.1, 1, 1, 1, SpecCounters(4, 4, 0, (0,)))
    m = step_rollout_metrics([s, other.summary(8)])
    assert m["rollout/accept_rate_pos_1"] == pytest.approx(4 / 8)
    assert m["rollout/accept_rate_pos_2"] == pytest.approx(2 / 4)
