"""recipe/dapo/canary.py: a draft source whose acceptance falls after a weight sync beyond chance is named."""

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
    import json

    from recipe.dapo.server_timeline import draft_counts_by_step

    rows = [{"t": 1.0, "mtp": [10, 5], "sam": [0, 0]}, {"t": 2.5, "mtp": [30, 15], "sam": [40, 10]},
            {"t": 4.0, "mtp": [50, 20], "sam": [60, 12]}]  # fmt: skip
    for server in ("a", "b"):
        (tmp_path / f"drafter-{server}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    windows = {1: (0.0, 2.0), 2: (2.0, 5.0)}
    counts = draft_counts_by_step(tmp_path, windows, {}, "hybrid")
    assert counts == {1: {"mtp": (20, 10), "sam": (0, 0)}, 2: {"mtp": (80, 30), "sam": (120, 24)}}
    engine = [{"t": 1.5, "draft_tokens": 4, "accepted_tokens": 3}, {"t": 3.0, "draft_tokens": 6, "accepted_tokens": 1}]
    for path in tmp_path.glob("drafter-*"):
        path.unlink()
    assert draft_counts_by_step(tmp_path, windows, {"e": engine}, "mtp") == {1: {"mtp": (4, 3)}, 2: {"mtp": (6, 1)}}
