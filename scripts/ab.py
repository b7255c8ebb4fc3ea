"""Seeded A/B runs of the DAPO recipe across speculative modes, and the tables and plots that compare them.

    python scripts/ab.py --name cpu24 trainer.total_training_steps=24        # all modes, then the report
    python scripts/ab.py --name cpu24 --modes off,sam_group                  # a subset
    python scripts/ab.py --name cpu24 --report-only                          # tables and plots again

Every mode runs the same config, data and seed (``python -m recipe.dapo`` in its own process, so a crash of
one mode loses nothing of the others, and a rerun resumes a killed mode from its checkpoint and skips
finished ones). Modes take turns in chunks of ``--chunk-steps`` training steps, each chunk resuming the mode's
run from its checkpoint (a resumed run logs what an uninterrupted one would), so that slow and fast spells of a
shared machine fall on every mode alike instead of on whichever mode ran during them. Runs go to
``runs/ab/<name>/<mode>/``; tables (markdown + CSV) and PNG plots to ``results/ab/<name>/``:
- (a) slime's layout: rollout tokens/s, long-tail tokens/s, longest-sample tokens/s, training time per step;
- (b) the Ascend SAM article's layout: average inference time per generation round, total rollout time per
  step, total time per step, and the gain over spec off;
- (c) speed at equal batch size: engine steps pooled by active requests, tokens/s per active request against
  spec off's in the same band (the long-tail figure compares tails of different sizes);
- lossless in training: each mode's per-step reward and response length against spec off (two-sided
  permutation test of the difference in means over steps, alpha 0.01), and the final greedy held-out accuracy
  of every data source (Fisher's exact test on the problems solved);
- means by quarter of the run: rollout tokens/s, acceptance length, the MTP head's top-1 and loss, reward;
- plots: acceptance length, rollout throughput, reward and response length per step, and one rollout's
  timeline (active requests and tokens/s over time) for spec off against SAM.

The report reads what each run logged (its ``metrics.jsonl`` and rollout timelines); it computes no metric the
run already has.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import DictConfig, OmegaConf
from scipy import stats

from recipe.dapo.report import held_out_keys, read_history
from recipe.dapo.timeline import speed_by_active_requests_vs_off

REPO_ROOT = Path(__file__).resolve().parents[1]

MODES: dict[str, list[str]] = {
    "off": ["spec=off"],
    "ngram": ["spec=ngram"],
    "suffix": ["spec=suffix"],
    "sam": ["spec=sam", "spec.sam.group_sharing=false", "spec.sam.cross_epoch=false"],
    "sam_group": ["spec=sam", "spec.sam.group_sharing=true", "spec.sam.cross_epoch=true"],
    "mtp_frozen": ["spec=mtp", "spec.mtp.train=frozen"],
    "mtp_online": ["spec=mtp", "spec.mtp.train=online"],
}
ALPHA = 0.01
# The configuration the committed A/Bs ran (results/ab/cpu200, drift_*, stale_head_*): the default before the demo
# moved to prompts the base model never saw (results/demo, "Before"): the first 256 prompts of the base model's SFT
# train split (data.train_files, added at run time), 8 groups per step, 4 optimizer steps per rollout, constant lr.
EARLIER_DEFAULT = (
    "data.train_max_samples=256", "data.val_max_samples=128", "data.train_batch_size=8", "data.gen_batch_size=12",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.optim.lr=1e-5",
    "actor_rollout_ref.actor.optim.lr_scheduler_type=constant", "trainer.total_training_steps=200",
    "trainer.test_freq=50", "trainer.save_freq=25",
)  # fmt: skip


def earlier_default() -> list[str]:
    """:data:`EARLIER_DEFAULT` with the embedded base model's SFT train split (built once if missing)."""
    from omegaconf import OmegaConf

    from recipe.sft.train import ensure_base_model

    train = ensure_base_model(OmegaConf.load(REPO_ROOT / "configs" / "sft.yaml")).parent / "data" / "train.parquet"
    return [f"data.train_files={train}", *EARLIER_DEFAULT]


def composed(overrides: list[str]) -> DictConfig:
    """The recipe's config with ``overrides``, as ``python -m recipe.dapo`` composes it."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(REPO_ROOT / "configs"), version_base=None):
        return compose(config_name="dapo", overrides=overrides)


def chunk_ends(steps: int, chunk_steps: int) -> list[int]:
    """The step each turn of a mode runs to: every ``chunk_steps`` steps, and the last (``chunk_steps <= 0``: all
    at once)."""
    if chunk_steps <= 0:
        return [steps]
    return [*range(chunk_steps, steps, chunk_steps), steps]


def run_modes(name: str, modes: list[str], overrides: list[str], runs_root: Path, chunk_steps: int) -> None:
    """Each mode in its own ``python -m recipe.dapo`` process, modes taking turns chunk by chunk; finished modes
    are skipped, killed ones resume."""
    cfg = composed([*overrides, *MODES[modes[0]]])  # with a mode's spec group, which overrides may set
    steps = int(cfg.trainer.total_training_steps)
    optim = cfg.actor_rollout_ref.actor.optim
    if cfg.backend == "verl" and len(chunk_ends(steps, chunk_steps)) > 1 and optim.lr_scheduler_type != "constant":
        raise SystemExit(
            "[ab] veRL's trainer spans the learning-rate schedule over each turn's trainer.total_training_steps, so "
            "turns would change a cosine schedule: run backend=verl A/Bs with --chunk-steps 0 or "
            "actor_rollout_ref.actor.optim.lr_scheduler_type=constant"
        )
    overrides = [o for o in overrides if not o.startswith("trainer.total_training_steps=")]
    pending = []
    for mode in modes:
        done = read_history(runs_root / name / mode)
        if done and done[-1]["step"] >= steps:
            print(f"[ab] {mode}: finished ({steps} steps) in {runs_root / name / mode}, skipped", flush=True)
        else:
            pending.append(mode)
    for end in chunk_ends(steps, chunk_steps):
        for mode in pending:
            run_dir = runs_root / name / mode
            done = read_history(run_dir)
            if done and done[-1]["step"] >= end:
                continue
            args = [
                *overrides,
                *MODES[mode],
                f"trainer.total_training_steps={end}",
                f"actor_rollout_ref.actor.optim.total_training_steps={steps}",  # the whole run's lr schedule
                f"trainer.default_local_dir={run_dir}",
                f"hydra.run.dir={run_dir}/hydra",
                f"trainer.experiment_name={mode}",
                "trainer.resume_mode=auto",
            ]
            print(f"[ab] {mode}: python -m recipe.dapo {' '.join(args)}", flush=True)
            proc = subprocess.run([sys.executable, "-m", "recipe.dapo", *args], cwd=REPO_ROOT)
            if proc.returncode != 0:
                raise SystemExit(f"[ab] mode {mode} failed (exit {proc.returncode}); rerun the same command to resume")


def series(h: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
    points = [(r["step"], r[key]) for r in h if key in r]
    if not points:
        return np.zeros(0), np.zeros(0)
    steps, values = zip(*points, strict=True)
    return np.asarray(steps), np.asarray(values, dtype=float)


def mean_of(h: list[dict], key: str, second_half: bool = False) -> float:
    steps, values = series(h, key)
    if second_half and len(values):
        values = values[steps > steps.max() / 2]
    return float(values.mean()) if len(values) else float("nan")


def permutation_p(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sided permutation test of equal means over steps (no distribution assumed; seeded, so reports
    reproduce)."""
    if len(a) < 2 or len(b) < 2:
        return math.nan
    res = stats.permutation_test(
        (a, b), lambda x, y, axis: x.mean(axis) - y.mean(axis), vectorized=True, n_resamples=20000, rng=0
    )
    return float(res.pvalue)


def solved_p(acc: float, acc_off: float, n: int) -> float:
    """Fisher's exact test that two greedy accuracies on the same ``n`` problems come from the same rate."""
    if acc != acc or acc_off != acc_off:
        return math.nan
    solved, solved_off = round(acc * n), round(acc_off * n)
    return float(stats.fisher_exact([[solved, n - solved], [solved_off, n - solved_off]]).pvalue)


def final(h: list[dict], key: str) -> float:
    values = series(h, key)[1]
    return float(values[-1]) if len(values) else math.nan


SLIME_METRICS = {  # table (a)'s columns read straight from the logged metric of each step
    "rollout_tok_s": "rollout/throughput_tok_s",
    "tail_tok_s": "rollout/tail_throughput_tok_s",
    "tail_request_tok_s": "rollout/tail_request_tok_s",
    "longest_sample_tok_s": "rollout/longest_sample_tok_s",
    "accept_len": "rollout/tokens_per_request_step",
    "tail_accept_len": "rollout/tail_tokens_per_request_step",
}


def tables(runs: dict[str, list[dict]], val_n: int) -> dict[str, list[dict]]:
    """Rows of every table, from each mode's logged metrics (means over steps)."""
    off = runs.get("off")
    slime, ascend, lossless = [], [], []
    for mode, h in runs.items():
        slime.append(
            {
                "mode": mode,
                **{column: mean_of(h, key) for column, key in SLIME_METRICS.items()},
                "train_s_per_step": mean_of(h, "timing_s/update_actor") + mean_of(h, "timing_s/old_log_prob"),
                "rollout_tok_s_2nd_half": mean_of(h, "rollout/throughput_tok_s", second_half=True),
            }
        )
        row = {
            "mode": mode,
            "inference_s_per_round": mean_of(h, "timing_s/gen_round_mean"),
            "rollout_s_per_step": mean_of(h, "timing_s/gen"),
            "total_s_per_step": mean_of(h, "timing_s/step"),
        }
        if off:
            row["rollout_gain_pct"] = 100 * (mean_of(off, "timing_s/gen") / row["rollout_s_per_step"] - 1)
            row["step_gain_pct"] = 100 * (mean_of(off, "timing_s/step") / row["total_s_per_step"] - 1)
        ascend.append(row)
        if off and mode != "off":
            score, score_off = series(h, "train/gen_score_mean")[1], series(off, "train/gen_score_mean")[1]
            length, length_off = series(h, "response_length/mean")[1], series(off, "response_length/mean")[1]
            row = {
                "mode": mode,
                "score_mean": float(score.mean()),
                "score_off": float(score_off.mean()),
                "score_p": permutation_p(score, score_off),
                "length_mean": float(length.mean()),
                "length_off": float(length_off.mean()),
                "length_p": permutation_p(length, length_off),
            }
            for key in greedy_keys(off):  # veRL's val-core/<data_source>/acc/greedy, one per data source
                source = key.split("/")[1]
                row[f"{source}_greedy_acc"], row[f"{source}_greedy_acc_off"] = final(h, key), final(off, key)
                row[f"{source}_greedy_p"] = solved_p(final(h, key), final(off, key), val_n)
            lossless.append(row)
    return {"slime": slime, "ascend": ascend, "lossless": lossless, "quarters": by_quarter(runs)}


def greedy_keys(h: list[dict]) -> list[str]:
    return [k for k in held_out_keys(h) if k.endswith("/acc/greedy")]


# per-quarter means in the report: (metric, label, decimals); a mode without the metric has no row
QUARTER_METRICS = (
    ("rollout/throughput_tok_s", "rollout tok/s", 0),
    ("rollout/spec_accept_length", "acceptance length", 2),
    ("mtp/head_acc", "MTP head top-1", 3),
    ("mtp/head_loss", "MTP head loss", 3),
    ("train/gen_score_mean", "reward (all generated)", 3),
    ("drift/kl_from_start", "KL from the starting policy (drift probe)", 4),
    ("drift/mtp_accept_start_head", "starting (frozen) head's expected acceptance (drift probe)", 3),
    ("drift/mtp_accept_head", "the run's head's expected acceptance (drift probe)", 3),
    ("rollout/spec_draft_acceptance_rate", "vLLM draft acceptance rate", 3),
)


def by_quarter(runs: dict[str, list[dict]]) -> list[dict]:
    """Each mode's metrics averaged over quarters of the training steps (steps (i-1)*S/4 < step <= i*S/4): how
    throughput, acceptance and the MTP head move over the run, and which quarter a slow spell fell in."""
    rows = []
    for mode, h in runs.items():
        for key, _, _ in QUARTER_METRICS:
            steps, values = series([r for r in h if r["step"] > 0], key)
            if not len(values):
                continue
            edges = np.linspace(0, steps.max(), 5)
            quarter = [values[(steps > lo) & (steps <= hi)] for lo, hi in zip(edges[:-1], edges[1:], strict=True)]
            rows.append({"mode": mode, "metric": key, **{f"q{i + 1}": float(q.mean()) if len(q) else math.nan
                                                        for i, q in enumerate(quarter)}})  # fmt: skip
    return rows


def cell(x: object, spec: str) -> str:
    """One table cell: ``x`` formatted with ``spec``; NaN shows as "-"."""
    return "-" if isinstance(x, float) and x != x else format(x, spec)


def md(rows: list[dict], columns: dict[str, tuple[str, str]] | None = None) -> str:
    """A markdown table of ``rows``: ``columns`` maps a row key to (header, format spec), headers may repeat
    (default: every key of the first row, as it is)."""
    columns = columns or {key: (key, "") for key in rows[0]}
    shown = [key for key in columns if key in rows[0]]
    frame = pd.DataFrame([[cell(r[key], columns[key][1]) for key in shown] for r in rows])
    frame.columns = [columns[key][0] for key in shown]
    return frame.to_markdown(index=False, disable_numparse=True)


SLIME_COLUMNS = {
    "mode": ("mode", ""),
    "rollout_tok_s": ("rollout tok/s", ".0f"),
    "tail_tok_s": ("long-tail tok/s", ".0f"),
    "tail_request_tok_s": ("long-tail tok/s per active request", ".0f"),
    "longest_sample_tok_s": ("longest-sample tok/s", ".1f"),
    "train_s_per_step": ("training s/step", ".2f"),
    "accept_len": ("tokens per request-step", ".2f"),
    "tail_accept_len": ("tail tokens per request-step", ".2f"),
    "rollout_tok_s_2nd_half": ("rollout tok/s, 2nd half", ".0f"),
}
RATIO_COLUMNS = {
    "rollout_tok_s": "rollout",
    "rollout_tok_s_2nd_half": "rollout, 2nd half",
    "tail_tok_s": "long tail",
    "tail_request_tok_s": "long tail per request",
}
ASCEND_COLUMNS = {
    "mode": ("mode", ""),
    "inference_s_per_round": ("avg inference time per round (s)", ".2f"),
    "rollout_s_per_step": ("total rollout time per step (s)", ".2f"),
    "total_s_per_step": ("total time per step (s)", ".2f"),
    "rollout_gain_pct": ("rollout gain vs off (%)", "+.1f"),
    "step_gain_pct": ("step gain vs off (%)", "+.1f"),
}


def markdown(t: dict[str, list[dict]], runs: dict[str, list[dict]], command: str, tail_threshold: int) -> str:
    steps = max((sum(r["step"] > 0 for r in h) for h in runs.values()), default=0)
    lines = [
        "# Seeded A/B: speculative rollout modes in DAPO training",
        "",
        f"Produced by `{command}` ({steps} steps per mode, same config, data and seed; means over steps of what "
        f"each run logged). Long tail: engine steps with at most {tail_threshold} active requests "
        "(recipe.long_tail_threshold); rollout metrics pool each step's generation rounds.",
        "",
        "## (a) Rollout and training speed (slime's layout)",
        "",
        md(t["slime"], SLIME_COLUMNS),
    ]
    off = next((r for r in t["slime"] if r["mode"] == "off"), None)
    if off:
        ratios = [
            {"mode": r["mode"], **{k: r[k] / off[k] if off[k] else math.nan for k in RATIO_COLUMNS}}
            for r in t["slime"]
            if r["mode"] != "off"
        ]
        lines += ["", "Over spec off (ratios of the columns above).", "",
                  md(ratios, {"mode": ("mode", "")} | {k: (v, ".2f") for k, v in RATIO_COLUMNS.items()})]  # fmt: skip
    lines += ["", "## (b) Time per step (the Ascend SAM article's layout)", "", md(t["ascend"], ASCEND_COLUMNS)]
    if t.get("by_active"):
        cells: dict[str, dict[str, str]] = {}
        for r in t["by_active"]:
            vs_off = r["request_tok_s_vs_off"]
            ratio = cell(vs_off, ".2f") + ("x" if vs_off == vs_off else "")
            cells.setdefault(r["mode"], {"mode": r["mode"]})[f"{r['active']} active"] = (
                f"{ratio} ({r['tokens_per_request_step']:.2f}; {100 * r['time_share']:.0f}%)"
            )
        lines += [
            "",
            "## (c) Speed at equal batch size",
            "",
            "Engine steps of all rollouts pooled by how many requests were active: tokens/s per active request "
            "over spec off's in the same band (tokens per request-step; share of the mode's rollout time). The "
            "long tail above compares tails that hold different numbers of requests when a drafter changes which "
            "requests are left at the end; here every band compares equal batch sizes.",
            "",
            md(list(cells.values())),
        ]
    if t["lossless"]:
        columns = {"mode": ("mode", ""), "score_mean": ("reward", ".3f"), "score_off": ("reward (off)", ".3f"),
                   "score_p": ("p", ".3f"), "length_mean": ("response length", ".1f"),
                   "length_off": ("response length (off)", ".1f"), "length_p": ("p", ".3f")}  # fmt: skip
        for key in t["lossless"][0]:
            if key.endswith("_greedy_acc"):
                source = key.removesuffix("_greedy_acc")
                columns |= {key: (f"final greedy acc, {source}", ".3f"), f"{key}_off": ("(off)", ".3f"),
                            f"{source}_greedy_p": ("p", ".3f")}  # fmt: skip
        rows = [r | {"agrees": "yes" if all(not (r[k] < ALPHA) for k in r if k.endswith("_p")) else "NO"}
                for r in t["lossless"]]  # fmt: skip
        lines += [
            "",
            "## Lossless in training",
            "",
            f"Per-step mean reward (before filtering) and response length of each mode against spec off: two-sided "
            f"permutation test of equal means over steps; final greedy held-out accuracy: Fisher's exact test on "
            f"the problems solved. A p-value below {ALPHA} would mean the mode changed what is learned beyond "
            f"run-to-run noise.",
            "",
            md(rows, columns | {"agrees": ("agrees", "")}),
        ]
    if t.get("quarters"):
        labels = {key: (label, nd) for key, label, nd in QUARTER_METRICS}
        rows = [{"mode": r["mode"], "metric": labels[r["metric"]][0],
                 **{f"Q{i}": cell(r[f"q{i}"], f".{labels[r['metric']][1]}f") for i in range(1, 5)}}
                for r in t["quarters"]]  # fmt: skip
        lines += ["", "## By quarter of the run", "", "Means over each quarter of the training steps.", "", md(rows)]
    lines += ["", "![acceptance](acceptance.png)", "", "![throughput](throughput.png)", ""]
    lines += ["![reward and length](reward_length.png)", "", "![drift](drift.png)", "", "![timeline](timeline.png)", ""]
    return "\n".join(lines)


def plots(runs: dict[str, list[dict]], runs_dir: Path, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def running(steps: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Trailing mean over a window of 1/8 of the run (no edge effects: the first points are dropped)."""
        w = max(1, len(values) // 8)
        if len(values) <= w:
            return steps, values
        return steps[w - 1 :], np.convolve(values, np.ones(w) / w, mode="valid")

    panels = [
        ("acceptance.png", [("rollout/spec_accept_length", "mean acceptance length (vLLM)",
                             ["ngram", "suffix", "sam", "sam_group", "mtp_frozen", "mtp_online"]),
                            ("mtp/head_acc", "MTP head top-1 accuracy on the step's responses",
                             ["mtp_frozen", "mtp_online"])]),
        ("throughput.png", [("rollout/throughput_tok_s", "rollout tokens/s", list(runs)),
                            ("rollout/tail_throughput_tok_s", "long-tail tokens/s", list(runs))]),
        ("reward_length.png", [("train/gen_score_mean", "mean reward (all generated)", list(runs)),
                               ("response_length/mean", "mean response length", list(runs))]),
    ]  # fmt: skip
    for filename, keys in panels:
        fig, axes = plt.subplots(1, len(keys), figsize=(6 * len(keys), 4), squeeze=False)
        for ax, (key, label, modes) in zip(axes[0], keys, strict=True):
            for mode in modes:
                steps, values = series(runs.get(mode, []), key)
                if len(values):
                    ax.plot(*running(steps, values), label=mode, lw=1.5)
            ax.set_title(label + " (running mean)", fontsize=10)
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / filename, dpi=110)
        plt.close(fig)
    drift_plot(runs, out / "drift.png")
    timeline_plot(runs_dir, out / "timeline.png")


def drift_plot(runs: dict[str, list[dict]], path: Path) -> None:
    """How far each run's policy moved (KL from its start on the drift probe, per step), and the MTP heads'
    acceptance against that drift: the starting head's and the run's head's expected acceptance on the probe, and
    vLLM's measured draft acceptance rate of the step's rollout."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for mode, h in runs.items():
        steps, kl = series(h, "drift/kl_from_start")
        if not len(kl):
            continue
        axes[0].plot(steps, kl, label=mode, lw=1.5)
        for key, style, name in (("drift/mtp_accept_start_head", ":", "starting head"),
                                 ("drift/mtp_accept_head", "-", "run's head"),
                                 ("rollout/spec_draft_acceptance_rate", ".", "vLLM measured")):  # fmt: skip
            if not mode.startswith("mtp") and key != "drift/mtp_accept_start_head":
                continue
            rows = [r for r in h if key in r and "drift/kl_from_start" in r]
            if rows:
                axes[1].plot([r["drift/kl_from_start"] for r in rows], [r[key] for r in rows], style, ms=3,
                             label=f"{mode}: {name}")  # fmt: skip
    axes[0].set_title("KL(start || now) per token on the drift probe", fontsize=10)
    axes[0].set_xlabel("step")
    axes[1].set_title("draft acceptance against drift", fontsize=10)
    axes[1].set_xlabel("KL from the starting policy")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def timeline_plot(runs_dir: Path, path: Path) -> None:
    """Active requests and tokens/s over one rollout (the last step's first round), spec off vs SAM."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for mode in ("off", "sam_group", "sam"):
        from recipe.dapo.timeline import saved_timelines

        by_step = saved_timelines(runs_dir / mode / "timelines")
        files = by_step[max(by_step)][:1] if by_step else []  # the last step's first round (first server's)
        if not files:
            continue
        steps = json.loads(files[-1].read_text())["steps"]
        t = np.array([s["start_s"] + s["duration_s"] for s in steps])
        active = np.array([s["active"] for s in steps])
        tok_s = np.array([s["tokens"] / max(s["duration_s"], 1e-9) for s in steps])
        axes[0].step(t, active, where="post", label=mode)
        axes[1].plot(t, np.convolve(tok_s, np.ones(5) / 5, mode="same"), label=mode, lw=1)
    axes[0].set_title(f"active requests ({files[-1].stem if files else ''})", fontsize=10)
    axes[1].set_title("tokens/s (5-step mean)", fontsize=10)
    for ax in axes:
        ax.set_xlabel("seconds into the rollout")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[1].set_yscale("log")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def load_timelines(run_dir: Path) -> dict[int, list]:
    """The run's saved rollout timelines by training step (one per generation round, per server on backend=verl)."""

    from recipe.dapo.timeline import RolloutTimeline, saved_timelines

    return {
        step: [RolloutTimeline.load(p) for p in paths] for step, paths in saved_timelines(run_dir / "timelines").items()
    }


def run_config(run_dir: Path):
    """The recipe config a mode ran with (Hydra's copy in the run's ``hydra/`` folder)."""
    path = run_dir / "hydra" / ".hydra" / "config.yaml"
    if not path.is_file():
        raise SystemExit(f"[ab] {path} is missing: was {run_dir} made by this script?")
    return OmegaConf.load(path)


def report(name: str, runs_root: Path, out_root: Path, command: str, val_n: int | None) -> Path:
    runs_dir = runs_root / name
    runs = {m: h for m in MODES if (h := read_history(runs_dir / m))}
    if not runs:
        raise SystemExit(f"[ab] no finished runs under {runs_dir}")
    cfg = run_config(runs_dir / next(iter(runs)))
    tail_threshold = int(cfg.recipe.long_tail_threshold)
    if val_n is None:
        if cfg.data.val_max_samples < 0:
            raise SystemExit(
                "[ab] data.val_max_samples is -1 (all rows): give --val-n, the number of held-out problems"
            )
        val_n = int(cfg.data.val_max_samples)
    out = out_root / name
    out.mkdir(parents=True, exist_ok=True)
    t = tables(runs, val_n)
    by_step = {m: load_timelines(runs_dir / m) for m in runs}
    t["by_active"] = speed_by_active_requests_vs_off(
        {m: [tl for step in sorted(tls) for tl in tls[step]] for m, tls in by_step.items()}
    )
    for key, rows in t.items():
        if rows:
            pd.DataFrame(rows).to_csv(out / f"{key}.csv", index=False)
    (out / "tables.json").write_text(json.dumps(t, indent=2))
    plots(runs, runs_dir, out)
    (out / "README.md").write_text(markdown(t, runs, command, tail_threshold))
    print((out / "README.md").read_text())
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", default="default", help="A/B name: runs/ab/<name>/, results/ab/<name>/")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated subset of {list(MODES)}")
    parser.add_argument("--runs-root", default=str(REPO_ROOT / "runs" / "ab"))
    parser.add_argument("--out-root", default=str(REPO_ROOT / "results" / "ab"))
    parser.add_argument("--report-only", action="store_true", help="only rebuild tables and plots")
    parser.add_argument("--val-n", type=int, help="held-out problems (default: the runs' data.val_max_samples)")
    parser.add_argument(
        "--chunk-steps",
        type=int,
        default=40,
        help="modes take turns every this many training steps (0: each mode runs through at once); a multiple of "
        "trainer.test_freq and trainer.save_freq keeps evaluations and checkpoints where an uninterrupted run has them",
    )
    parser.add_argument(
        "--earlier-default",
        action="store_true",
        help="run the configuration of the committed A/Bs (EARLIER_DEFAULT; the overrides given still apply)",
    )
    args, overrides = parser.parse_known_args(argv)
    modes = args.modes.split(",")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"unknown mode(s) {unknown}; known: {list(MODES)}")
    bad = [o for o in overrides if "=" not in o or o.startswith("-")]
    if bad:
        parser.error(f"not a Hydra override (key=value): {bad}")
    runs_root, out_root = Path(args.runs_root), Path(args.out_root)
    if args.earlier_default:
        overrides = [*earlier_default(), *overrides]
    if not args.report_only:
        run_modes(args.name, modes, overrides, runs_root, args.chunk_steps)
    given = argv if argv is not None else sys.argv[1:]
    command = "python scripts/ab.py " + " ".join(a for a in given if a != "--report-only")
    report(args.name, runs_root, out_root, command, args.val_n)


if __name__ == "__main__":
    main()
