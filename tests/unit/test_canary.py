"""recipe/dapo/canary.py: a draft source whose acceptance falls after a weight sync beyond chance is named."""

import json
import logging

from recipe.dapo.canary import AcceptanceCanary


def test_a_fall_beyond_chance_is_warned_about_naming_source_and_step(caplog) -> None:
    canary = AcceptanceCanary()
    assert canary.check(1, {"mtp": (400, 200), "sam": (300, 90)}) == {}  # no level yet
    steady = canary.check(2, {"mtp": (400, 190), "sam": (300, 95)})
    assert steady["rollout/canary_mtp_fell"] == 0.0 and steady["rollout/canary_sam_fell"] == 0.0
    assert steady["rollout/canary_mtp_level_before"] == 0.5
    with caplog.at_level(logging.WARNING, logger="recipe.dapo.canary"):
        fallen = canary.check(3, {"mtp": (400, 8), "sam": (300, 88)})  # a head at chance after the sync
    assert fallen["rollout/canary_mtp_fell"] == 1.0 and fallen["rollout/canary_sam_fell"] == 0.0
    assert fallen["rollout/canary_mtp_acceptance"] == 0.02
    (record,) = caplog.records
    assert "step 3, mtp drafts accepted 0.020" in record.getMessage()
    # a model-free source's fall is reported, never called a broken sync (in the hybrid it follows the head's)
    assert canary.check(4, {"sam": (300, 10)})["rollout/canary_sam_fell"] == 0.0


def test_too_few_drafts_or_a_small_fall_are_not_alarms() -> None:
    canary = AcceptanceCanary()
    canary.check(1, {"mtp": (1000, 500)})
    assert canary.check(2, {"mtp": (20, 0)}) == {}  # too few draft tokens to judge
    assert canary.check(3, {"mtp": (1000, 420)})["rollout/canary_mtp_fell"] == 0.0  # drift, not a broken sync
    # a fall of over a third, far beyond the token-level test's chance, but within what a step of few responses moves
    assert canary.check(4, {"mtp": (1000, 270)})["rollout/canary_mtp_fell"] == 0.0


def test_a_veRL_steps_counts_come_from_the_hybrid_drafters_cumulative_rows_or_the_servers_totals(tmp_path) -> None:
    """Per step window: the difference of each drafter file's last rows before its start and its end, summed over
    servers; without drafter files, the servers' timeline totals under the method's name."""
    from recipe.dapo.server_timeline import draft_counts_by_step

    rows = [{"t": 1.0, "mtp": [10, 5], "sam": [0, 0]}, {"t": 2.5, "mtp": [30, 15], "sam": [40, 10]},
            {"t": 4.0, "mtp": [50, 20], "sam": [60, 12]}]  # fmt: skip
    windows = {1: (0.0, 2.0), 2: (2.0, 5.0)}
    counts = draft_counts_by_step([rows, rows], {}, windows, "hybrid")  # two servers
    assert counts == {1: {"mtp": (20, 10), "sam": (0, 0)}, 2: {"mtp": (80, 30), "sam": (120, 24)}}
    engine = [{"t": 1.5, "draft_tokens": 4, "accepted_tokens": 3}, {"t": 3.0, "draft_tokens": 6, "accepted_tokens": 1}]
    assert draft_counts_by_step([], {"e": engine}, windows, "mtp") == {1: {"mtp": (4, 3)}, 2: {"mtp": (6, 1)}}


def append(path, *rows) -> None:
    with path.open("a") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)


def test_the_live_canary_warns_while_the_broken_step_runs_and_keeps_each_checked_step_on_disk(tmp_path, caplog):
    """The launcher's canary on a veRL run's files as the job writes them: a healthy step 1 (its drafts judged when its
    mark lands), then a head at chance in step 2, warned about while step 2 still runs (no mark yet), once; step 2's
    row lands with its mark, and what was written survives the launcher (read back by a fresh reader)."""
    from recipe.dapo.server_timeline import CANARY_FILE, LiveCanary, canary_rows
    from recipe.dapo.step_marks import STEP_MARKS

    timeline = tmp_path / "server_timeline"
    timeline.mkdir()
    drafter, marks = timeline / "drafter-h-1.jsonl", tmp_path / STEP_MARKS
    launch = {"launch": 100.0, "resumed_from": 0}
    live = LiveCanary(tmp_path, "hybrid", 100.0, 0)
    append(drafter, {"t": 101.0, "mtp": [0, 0], "sam": [0, 0]}, {"t": 105.0, "mtp": [400, 200], "sam": [100, 30]})
    live.poll(now=106.0)
    assert not (tmp_path / CANARY_FILE).exists()  # step 1 still running: no level to judge it by
    append(marks, {"step": 1, "t": 110.0, **launch})
    live.poll(now=111.0)
    assert list(canary_rows(tmp_path)) == [1]  # checked as soon as marked; the first step has no level before
    append(drafter, {"t": 115.0, "mtp": [600, 203], "sam": [150, 45]})  # step 2 so far: 3 of 200 head drafts
    with caplog.at_level(logging.WARNING):
        live.poll(now=116.0)
        live.poll(now=117.0)
    warnings = [r.getMessage() for r in caplog.records if "acceptance canary" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith("acceptance canary: step 2, mtp drafts accepted 0.015")
    assert list(canary_rows(tmp_path)) == [1]  # step 2 not marked yet
    append(marks, {"step": 2, "t": 120.0, **launch})
    with caplog.at_level(logging.WARNING):
        live.poll(now=121.0)
    assert len([r for r in caplog.records if "acceptance canary" in r.getMessage()]) == 1  # warned once
    row = canary_rows(tmp_path)[2]
    assert row["rollout/canary_mtp_fell"] == 1.0 and row["warned_at"] == 116.0 < 120.0  # before the step ended
    assert row["rollout/canary_sam_fell"] == 0.0  # a model-free source's change is reported, never an alarm


def test_a_relaunchs_canary_starts_from_the_levels_of_the_steps_before_it_resumed(tmp_path):
    """A launcher killed after step 2 and relaunched from step 2: its canary judges step 3 against steps 1-2's
    acceptance, read back from what the first launch's servers wrote, and writes no row for them again."""
    from recipe.dapo.server_timeline import LiveCanary, canary_rows
    from recipe.dapo.step_marks import STEP_MARKS

    timeline = tmp_path / "server_timeline"
    timeline.mkdir()
    append(timeline / "engine-h-1-0.jsonl", *[{"t": t, "draft_tokens": 200, "accepted_tokens": 100} for t in (2, 6)])
    first = {"launch": 1.0, "resumed_from": 0}
    append(tmp_path / STEP_MARKS, {"step": 1, "t": 4.0, **first}, {"step": 2, "t": 8.0, **first})
    second = {"launch": 20.0, "resumed_from": 2}
    relaunch = LiveCanary(tmp_path, "mtp", 20.0, 2)
    relaunch.replay_earlier()
    assert relaunch.canary.level["mtp"][1] / relaunch.canary.level["mtp"][0] == 0.5
    append(timeline / "engine-h-1-0.jsonl", {"t": 22.0, "draft_tokens": 200, "accepted_tokens": 2})
    append(tmp_path / STEP_MARKS, {"step": 3, "t": 24.0, **second})
    relaunch.poll(now=25.0)
    assert list(canary_rows(tmp_path)) == [3] and canary_rows(tmp_path)[3]["rollout/canary_mtp_fell"] == 1.0
