"""recipe.ab's run names (a mode, or a further run of one as an A/A control; seed folders) and its across-seeds
verdict on the reward, from real files laid out as the runner writes them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recipe.ab.render import off_against_off
from recipe.ab.runner import base_mode, modes_on_disk, run_dir_of, seeds_on_disk, turn_warnings
from recipe.ab.stats import across_seeds, by_quarter


def test_a_further_run_of_a_mode_names_that_mode_and_anything_else_is_unknown() -> None:
    assert base_mode("sam") == "sam" and base_mode("sam_every-2") == "sam_every" and base_mode("off-3") == "off"
    assert base_mode("sam-1") is None and base_mode("sam-x") is None and base_mode("bogus-2") is None


def test_turns_between_evaluations_or_checkpoints_are_named_and_turns_on_them_are_not() -> None:
    assert turn_warnings(16, 8, test_freq=8, save_freq=4) == []
    assert turn_warnings(16, 0, test_freq=32, save_freq=32) == []  # one turn: the end is the run's own
    evaluation, checkpoint = turn_warnings(16, 4, test_freq=8, save_freq=0)
    assert "trainer.test_freq=8" in evaluation and "[4, 12]" in evaluation
    assert "trainer.save_freq=0" in checkpoint and "[4, 8, 12]" in checkpoint


def test_runs_on_disk_come_in_the_modes_order_with_each_modes_further_runs_after_it(tmp_path: Path) -> None:
    for seed in (0, 1):
        for mode in ("sam_every-2", "sam", "off", "sam_every", "off-2"):
            run_dir_of(tmp_path, mode, seed).mkdir(parents=True)
    (tmp_path / "seed0" / "plots").mkdir()  # not a run
    (tmp_path / "seedling").mkdir()  # not a seed folder
    assert seeds_on_disk(tmp_path) == [0, 1]
    assert modes_on_disk(tmp_path / "seed0") == ["off", "off-2", "sam", "sam_every", "sam_every-2"]
    assert seeds_on_disk(tmp_path / "seed0") == [] and modes_on_disk(tmp_path / "missing") == []


def history(reward: float, rollout_tok_s: float, step_s: float, steps: int = 4) -> list[dict]:
    return [{"step": 0}] + [
        {"step": s, "train/gen_score_mean": reward, "rollout/throughput_tok_s": rollout_tok_s, "timing_s/step": step_s}
        for s in range(1, steps + 1)
    ]


def test_a_mode_agrees_with_spec_off_within_the_seed_spread_and_not_beyond_it() -> None:
    runs = {
        0: {"off": history(0.10, 100, 2.0), "sam": history(0.12, 150, 1.0), "hybrid": history(0.30, 160, 1.0)},
        1: {"off": history(0.14, 110, 2.2, steps=3), "sam": history(0.13, 160, 1.1)},
    }
    decode = {0: {"off": 1.0, "sam": 1.2, "hybrid": 1.1}, 1: {"off": 1.0, "sam": 1.3}}  # from the timelines
    per_seed, summary = across_seeds(runs, decode)
    assert {(r["mode"], r["seed"]) for r in per_seed} == {(m, 0) for m in runs[0]} | {(m, 1) for m in runs[1]}
    assert all(r["to_step"] == 3 for r in per_seed)  # the last step every run reached
    assert next(r for r in per_seed if r["mode"] == "off" and r["seed"] == 0)["wall_clock_s"] == pytest.approx(6.0)
    by_mode = {r["mode"]: r for r in summary}
    # sam: two seeds, paired with off's of the same seed; off's seeds spread by 0.04, sam's mean 0.005 above off's
    assert by_mode["sam"]["rollout_tok_s_vs_off"] == pytest.approx((1.5 * 160 / 110) ** 0.5)
    assert by_mode["sam"]["reward_seed_spread"] == pytest.approx(0.04) and by_mode["sam"]["agrees"] == "yes"
    assert by_mode["sam"]["speedup_to_step"] == pytest.approx(2.0)  # 6 s against 3 s, 6.6 s against 3.3 s
    assert by_mode["sam"]["decode_vs_off"] == pytest.approx((1.2 * 1.3) ** 0.5)
    # hybrid: one seed, 0.18 above off's mean: beyond off's spread
    assert by_mode["hybrid"]["seeds"] == 1 and by_mode["hybrid"]["agrees"] == "NO"
    json.dumps(summary)  # the report writes it as it is


def test_a_run_that_trains_no_head_shows_its_starting_heads_figures_once() -> None:
    def run(own_head_moves: float) -> list[dict]:
        return [{"step": 0}] + [
            {"step": s, "drift/mtp_accept_start_head": 0.30, "drift/mtp_accept_head": 0.30 + own_head_moves * s}
            for s in range(1, 5)
        ]

    rows = by_quarter({"off": run(0.0), "mtp_online": run(0.01)})
    shown = {(r["mode"], r["metric"]) for r in rows}
    assert ("off", "drift/mtp_accept_start_head") in shown and ("off", "drift/mtp_accept_head") not in shown
    assert {("mtp_online", "drift/mtp_accept_start_head"), ("mtp_online", "drift/mtp_accept_head")} <= shown


def test_the_aa_control_weighs_a_later_seeds_spec_off_by_the_first_seeds_mix_of_batch_sizes() -> None:
    def bands(mode: str, request_tok_s: list[float], shares: list[float]) -> list[dict]:
        return [
            {"mode": mode, "active": str(i), "request_tok_s": v, "time_share": s, "request_tok_s_vs_off": float("nan")}
            for i, (v, s) in enumerate(zip(request_tok_s, shares, strict=True))
        ]

    first = bands("off", [10.0, 20.0], [0.5, 0.5])
    # seed 1's spec off: twice as fast in the first band, as fast in the second; seed 2 ran no spec off
    by_active = {0: first, 1: bands("off", [20.0, 20.0], [0.9, 0.1]), 2: bands("sam", [5.0, 5.0], [0.5, 0.5])}
    (row,) = off_against_off(by_active)
    # at seed 0's mix: half the time at 2x, half at 1x -> 1 / (0.5 / 2 + 0.5 / 1)
    assert (row["seed"], row["against_seed"]) == (1, 0) and row["vs_off"] == pytest.approx(1 / 0.75)
    assert off_against_off({0: first, 2: by_active[2]}) == []
