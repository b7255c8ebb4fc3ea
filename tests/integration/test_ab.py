"""Seeded A/B (python -m recipe.ab): a real two-mode run from command to tables, read from what the runs logged."""

from __future__ import annotations

import csv
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[2]


def test_two_mode_ab_runs_and_writes_tables_and_plots(harness_model, tmp_path):
    """Two modes at seed 0, then spec off again at seed 1 (a second seed for some modes, as a real A/B adds them):
    modes take turns, the tables are the runs' logged metrics, and the across-seeds section pairs every run."""
    data = harness_model.parent / "data"
    args = [
        sys.executable, "-m", "recipe.ab", "--name", "t", "--seeds", "0", "--modes", "off,sam", "--chunk-steps", "1",
        "--runs-root", str(tmp_path / "runs"), "--out", str(tmp_path / "results" / "t"), "--val-n", "8",
        f"actor_rollout_ref.model.path={harness_model}", f"data.train_files={data / 'train.parquet'}",
        f"data.val_files={data / 'test.parquet'}", "trainer.total_training_steps=2",
        "data.train_batch_size=2", "data.gen_batch_size=3", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.rollout.n=4", "data.max_response_length=128", "reward.reward_kwargs.overlong_buffer_cfg.len=32",
        "data.val_max_samples=8", "trainer.test_freq=0", "recipe.progress_bar=false",
        "recipe.train_probe.prompts=4", "recipe.train_probe.n=2",
    ]  # fmt: skip
    proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    turns = re.findall(r"^\[ab\] (\w+) \(seed 0\): .*trainer\.total_training_steps=(\d+) ", proc.stdout, flags=re.M)
    assert turns == [("off", "1"), ("sam", "1"), ("off", "2"), ("sam", "2")]  # modes take turns, one step each
    second = [a if a != "off,sam" else "off" for a in args]
    second[second.index("--seeds") + 1] = "1"
    second[second.index("--chunk-steps") + 1] = "2"  # one mode alone has no one to take turns with: one launch
    proc = subprocess.run(second, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    runs = tmp_path / "runs" / "t"
    out = tmp_path / "results" / "t"
    readme = (out / "README.md").read_text()
    headings = ("(a) Rollout and training speed", "(b) Time per step", "(c) Speed at equal batch size", "Lossless")
    for heading in (*headings, "By quarter of the run"):
        assert heading in readme
    assert re.search(r"^\| sam +\|", readme, re.M) and re.search(r"^\| off +\|", readme, re.M)
    for png in ("acceptance.png", "throughput.png", "reward_length.png", "timeline.png"):
        assert (out / png).stat().st_size > 5000, png
    assert (out / "slime.csv").read_text().count("\n") == 3  # header + two modes
    quarters = list(csv.DictReader(open(out / "quarters.csv")))
    assert {(r["mode"], r["metric"]) for r in quarters} >= {
        ("sam", "rollout/spec_accept_length"),
        ("off", "train/gen_score_mean"),
    }
    # two steps: the first falls in quarter 2 (0.5 < step <= 1.0), the second in quarter 4; quarters 1 and 3 are empty
    off_reward = next(r for r in quarters if r["mode"] == "off" and r["metric"] == "train/gen_score_mean")
    assert off_reward["q1"] == off_reward["q3"] == "" and not math.isnan(float(off_reward["q2"]))
    by_active = pd.read_csv(out / "by_active.csv")
    assert list(by_active["mode"]) == ["off"] * 6 + ["sam"] * 6
    off_band = by_active[by_active["mode"] == "off"].set_index("active")["request_tok_s"]
    sam = by_active[(by_active["mode"] == "sam") & (by_active["time_share"] > 0)].set_index("active")
    shared = [b for b in sam.index if off_band[b] > 0]  # bands both modes spent time in
    assert shared  # each band of a mode against spec off's band of the same batch size
    assert np.allclose(sam.loc[shared, "request_tok_s_vs_off"], sam.loc[shared, "request_tok_s"] / off_band[shared])
    # the whole rollout's decode speed at spec off's mix of batch sizes: off's time in each band at sam's speed there
    decode = {r["mode"]: r["vs_off"] for r in json.loads((out / "tables.json").read_text())["decode_vs_off"]}
    off_share = by_active[by_active["mode"] == "off"].set_index("active")["time_share"]
    spent = off_share[off_share > 0]
    assert decode["off"] == pytest.approx(1.0) and spent.sum() == pytest.approx(1.0)
    if set(spent.index) <= set(shared):
        assert decode["sam"] == pytest.approx(1 / sum(spent / sam.loc[spent.index, "request_tok_s_vs_off"]))
    else:  # sam has no decode step in a band spec off spends time in: no equal-work figure
        assert math.isnan(decode["sam"])
    # the tables are the runs' logged metrics: each column is the mean over steps of the key the recipe logs
    slime = {r["mode"]: r for r in json.loads((out / "tables.json").read_text())["slime"]}
    for mode in ("off", "sam"):
        logged = [json.loads(x) for x in (runs / "seed0" / mode / "metrics.jsonl").read_text().splitlines()]
        for column, key in (("rollout_tok_s", "rollout/throughput_tok_s"), ("tail_tok_s", "rollout/tail_throughput_tok_s"),
                            ("accept_len", "rollout/tokens_per_request_step")):  # fmt: skip
            values = [r[key] for r in logged if key in r]
            assert values and slime[mode][column] == pytest.approx(np.mean(values), rel=1e-9), (mode, column)
    lossless = json.loads((out / "tables.json").read_text())["lossless"]
    assert [r["mode"] for r in lossless] == ["sam"]
    assert 0 < lossless[0]["tiny_sum_greedy_p"] <= 1  # held-out key of the data source
    # two paired steps cannot show the same learning either way: the report says so rather than "yes"
    assert lossless[0]["score_verdict"] == lossless[0]["length_verdict"] == "not shown"
    assert readme.count("not shown") >= 3
    # every run side by side: seed 1 sampled other responses; sam's speed against spec off's of its own seed
    seeds = {(r["mode"], r["seed"]): r for r in json.loads((out / "tables.json").read_text())["seeds"]}
    assert set(seeds) == {("off", 0), ("sam", 0), ("off", 1)} and "## Across seeds" in readme
    assert (out / "seeds.png").stat().st_size > 5000
    logged_off = [[json.loads(x) for x in (runs / f"seed{s}" / "off" / "metrics.jsonl").open()] for s in (0, 1)]
    lengths = [[r["response_length/mean"] for r in rows if "response_length/mean" in r] for rows in logged_off]
    assert lengths[0] != lengths[1]
    (sam_vs_off,) = json.loads((out / "tables.json").read_text())["seeds_vs_off"]
    ratio = seeds[("sam", 0)]["rollout_tok_s"] / seeds[("off", 0)]["rollout_tok_s"]
    assert sam_vs_off["seeds"] == 1 and sam_vs_off["rollout_tok_s_vs_off"] == pytest.approx(ratio)
    spread = abs(seeds[("off", 0)]["reward"] - seeds[("off", 1)]["reward"])  # sam has one seed: off's spread alone
    assert sam_vs_off["reward_seed_spread"] == pytest.approx(spread)
    assert sam_vs_off["agrees"] == (
        "-" if spread == 0 else "yes" if abs(sam_vs_off["reward_minus_off"]) <= spread else "NO"
    )
    # the A/A control: the two spec-off runs' decode speed at equal work, one against the other, printed in the README
    (aa,) = json.loads((out / "tables.json").read_text())["off_vs_off"]
    assert (aa["seed"], aa["against_seed"]) == (1, 0) and 0.2 < aa["vs_off"] < 5
    assert (
        f"against spec off at seed 0 (the same code on other samples), decode speed at equal work: **{aa['vs_off']:.2f}x**"
        in readme
    )
    again = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and again.stdout.count("skipped") == 2  # finished modes are not rerun
