"""recipe/summarize.py's test of a held-out rise, on validation dumps in veRL's format."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from recipe import summarize as summarize_run

REPO = Path(__file__).resolve().parents[2]


def write_dump(folder: Path, step: int, accs: np.ndarray) -> None:
    """``accs[problem, sample]`` as veRL's ``<step>.jsonl``, rows in a shuffled order (pairing is by prompt)."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = [{"input": f"problem {i}", "output": "", "gts": "0", "score": 1.0 if a else -1.0, "step": step, "acc": bool(a)}
            for i, problem in enumerate(accs) for a in problem]  # fmt: skip
    order = np.random.default_rng(step).permutation(len(rows))
    (folder / f"{step}.jsonl").write_text("".join(json.dumps(rows[i]) + "\n" for i in order))


def test_a_rise_on_the_same_problems_is_significant_and_no_change_is_not(tmp_path):
    rng = np.random.default_rng(0)
    difficulty = rng.uniform(0.05, 0.6, size=(200, 1))
    before = rng.random((200, 4)) < difficulty
    after = rng.random((200, 4)) < difficulty + 0.12
    rose, flat = tmp_path / "rose", tmp_path / "flat"
    for step, accs in ((0, before), (50, before), (100, after)):
        write_dump(rose, step, accs)
    write_dump(flat, 0, before)
    write_dump(flat, 100, before)
    (result,) = summarize_run.heldout_rise(rose)
    assert result["first_step"] == 0 and result["last_step"] == 100 and result["problems"] == 200
    assert result["first"] == before.mean() and result["last"] == after.mean()
    assert result["p_value"] < 0.01
    assert summarize_run.heldout_rise(flat)[0]["p_value"] > 0.4  # no difference at all: nowhere near significant


def test_a_fall_is_not_reported_as_a_rise(tmp_path):
    rng = np.random.default_rng(1)
    before = rng.random((200, 4)) < 0.4
    write_dump(tmp_path, 0, before)
    write_dump(tmp_path, 100, rng.random((200, 4)) < 0.3)
    assert summarize_run.heldout_rise(tmp_path)[0]["p_value"] > 0.5  # one-sided: a fall is evidence against


def test_run_summary_states_first_and_last_of_reward_and_held_out_accuracy_and_where_the_files_are(tmp_path):
    from recipe.dapo.report import run_summary, step_line
    from recipe.dapo.run_dir import LATEST_FILE

    history = [{"step": 0, "val-core/tiny_sum/acc/mean@4": 0.25, "val-core/tiny_sum/acc/greedy": 0.40}]
    for step in range(1, 9):
        history.append({"step": step, "train/gen_score_mean": 0.1 * step, "rollout/throughput_tok_s": 1000.0 * step})
    history[-1].update({"val-core/tiny_sum/acc/mean@4": 0.30, "val-core/tiny_sum/acc/greedy": 0.50})
    (tmp_path / LATEST_FILE).write_text("8\n")
    summary = run_summary(history, tmp_path)
    assert f"8 training steps in {tmp_path}" in summary
    assert "first -> last quarter: 0.150 -> 0.750" in summary  # means of steps 1-2 and 7-8
    assert "val-core/tiny_sum/acc/mean@4: 0.250 (step 0) -> 0.300 (step 8)" in summary
    assert "val-core/tiny_sum/acc/greedy: 0.400 (step 0) -> 0.500 (step 8)" in summary
    assert "rollout tokens/s 4500" in summary
    assert str(tmp_path / "global_step_8") in summary
    line = step_line(8, 8, history[-1])
    assert line.startswith("step 8/8  reward 0.800") and "tiny_sum/acc/greedy 0.500" in line


def test_every_rollout_metric_a_report_reads_is_one_the_rollout_logs():
    """The console line, the summary, the run's curves and the A/B tables name ``rollout/*`` metrics by string; each
    must be a key the timeline logs for a step with a tail and drafts (a renamed metric would leave a column empty)."""
    from recipe.ab.stats import QUARTER_METRICS, SLIME_METRICS
    from recipe.dapo.report import PANELS, STEP_LINE, SUMMARY_SPEED
    from recipe.dapo.timeline import RolloutTimeline, step_rollout_metrics
    from recipe.engine import SpecCounters

    tl = RolloutTimeline(num_requests=16)
    for i, (active, drafts) in enumerate([(16, 4), (16, 4), (4, 2), (1, 1)]):
        tl.step(0.01 * i, 0.01, active, active, 2 * active, SpecCounters(drafts, 3 * drafts, drafts))
        if active < 16:
            tl.finish(f"r{i}", 10, 0.01 * (i + 1))
    tl.drafter_s = 0.004  # a SAM drafter's own time
    logged = set(step_rollout_metrics([tl.summary(tail_threshold=8)]))
    read = {k for k, *_ in [*PANELS, *STEP_LINE, *SUMMARY_SPEED, *QUARTER_METRICS]} | set(SLIME_METRICS.values())
    assert {k for k in read if k.startswith("rollout/")} <= logged


def test_a_rise_weak_in_each_seed_is_significant_pooled_and_opposite_runs_cancel(tmp_path):
    rng = np.random.default_rng(2)
    difficulty = rng.uniform(0.05, 0.6, size=(300, 1))
    before = rng.random((300, 4)) < difficulty
    rose, mixed = [], []
    for seed, shift in enumerate((0.02, 0.02, 0.02)):
        rose.append(tmp_path / f"rose{seed}")
        write_dump(rose[-1], 0, before)
        write_dump(rose[-1], 100, rng.random((300, 4)) < difficulty + shift)
    for seed, shift in enumerate((0.1, -0.1)):
        mixed.append(tmp_path / f"mixed{seed}")
        write_dump(mixed[-1], 0, before)
        write_dump(mixed[-1], 100, rng.random((300, 4)) < np.clip(difficulty + shift, 0, 1))
    alone = [summarize_run.heldout_rise(d)[0]["p_value"] for d in rose]
    (pooled,) = summarize_run.pooled_rise(rose)
    assert max(alone) > 0.01 and pooled["p_value"] < 0.01, (alone, pooled)
    assert pooled["runs"] == 3 and pooled["problems"] == 300 and pooled["first"] == [before.mean()] * 3
    assert pooled["last"] == [summarize_run.heldout_rise(d)[0]["last"] for d in rose]
    assert pooled["mean_rise"] == pytest.approx(np.mean(pooled["last"]) - before.mean())  # every seed counts
    assert summarize_run.pooled_rise(mixed)[0]["p_value"] > 0.05


def test_the_drift_table_names_keys_the_probe_and_the_rollout_log_and_has_a_row_per_probed_step():
    import copy

    from test_drift import probe_sequences
    from test_mtp import tiny_model

    from recipe.dapo.drift import DriftProbe
    from recipe.dapo.timeline import RolloutTimeline, step_rollout_metrics
    from recipe.engine import SpecCounters

    start = tiny_model(seed=0)
    drift = DriftProbe(copy.deepcopy(start), probe_sequences(), 1.0).measure(start)
    tl = RolloutTimeline(num_requests=4)
    tl.step(0.0, 0.01, 4, 4, 8, SpecCounters(4, 12, 4))
    tl.finish("r0", 10, 0.01)
    logged = step_rollout_metrics([tl.summary(tail_threshold=8)])
    assert {key for key, _ in summarize_run.DRIFT_COLUMNS} <= set(drift) | set(logged)
    history = [{"step": 0}, {"step": 1, **drift, **logged}, {"step": 2, **drift, "drift/kl_from_start": 0.25}]
    table = summarize_run.drift_table(history)
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table if line.startswith("| ")][1:]
    assert [r[0] for r in rows] == ["1", "2"]  # a row per probed step, under the header
    assert rows[-1][1] == "0.250" and rows[-1][-2:] == ["-", "-"]  # step 2 logged no rollout
    assert summarize_run.drift_table([{"step": 1, "critic/score/mean": 0.5}]) == []
