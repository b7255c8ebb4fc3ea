"""An A/B's report: markdown and CSV tables in the source documents' layouts, and PNG plots, in
``results/ab/<name>/``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from recipe.ab.runner import HEAD_MODES, base_mode, modes_on_disk, seed_dir, seeds_on_disk
from recipe.ab.stats import ALPHA, EQUIVALENCE_ALPHA, EQUIVALENCE_MARGINS, QUARTER_METRICS, across_seeds, series, tables
from recipe.dapo.run_dir import read_history
from recipe.dapo.timeline import (
    RolloutTimeline,
    bands_vs_off,
    equal_work_vs_off,
    saved_timelines,
    speed_by_active_requests_vs_off,
)
from recipe.provenance import commit, machine
from recipe.tables import markdown as markdown_table


def cell(x: object, spec: str) -> str:
    """One table cell: ``x`` formatted with ``spec``; NaN shows as "-"."""
    return "-" if isinstance(x, float) and x != x else format(x, spec)


def md(rows: list[dict], columns: dict[str, tuple[str, str]] | None = None) -> str:
    """A markdown table of ``rows``: ``columns`` maps a row key to (header, format spec), headers may repeat
    (default: every key of the first row, as it is)."""
    columns = columns or {key: (key, "") for key in rows[0]}
    shown = [key for key in columns if key in rows[0]]
    return markdown_table(
        [[cell(r[key], columns[key][1]) for key in shown] for r in rows], [columns[k][0] for k in shown]
    )


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


def markdown(
    t: dict[str, list[dict]], runs: dict[str, list[dict]], command: str, tail_threshold: int, seed: int | None
) -> str:
    steps = max((sum(r["step"] > 0 for r in h) for h in runs.values()), default=0)
    same = "same config, data and seed" if seed is None else f"same config and data; seed {seed}'s runs"
    lines = [
        "# Seeded A/B: speculative rollout modes in DAPO training",
        "",
        f"Produced by `{command}` ({steps} steps per mode, {same}; means over steps of what "
        f"each run logged). Long tail: engine steps with at most {tail_threshold} active requests "
        "(recipe.long_tail_threshold); rollout metrics pool each step's generation rounds. Tables written on "
        f"{machine()} at commit {commit()}.",
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
        for r in t["decode_vs_off"]:
            cells[r["mode"]] = {"mode": r["mode"], "at off's mix": f"{cell(r['vs_off'], '.2f')}x"}
        for r in t["by_active"]:
            vs_off = r["request_tok_s_vs_off"]
            speed = cell(vs_off, ".2f") + ("x" if vs_off == vs_off else "")
            cells.setdefault(r["mode"], {"mode": r["mode"]})[f"{r['active']} active"] = (
                f"{speed} ({r['tokens_per_request_step']:.2f}; {100 * r['time_share']:.0f}%)"
            )
        lines += [
            "",
            "## (c) Speed at equal batch size",
            "",
            "Decode steps (those that prefilled no request) of all rollouts pooled by how many requests were "
            "active: tokens/s per active request over spec off's in the same band (tokens per request-step; share "
            "of the mode's decode time), and over all bands at spec off's mix of them (equal work). The long tail "
            "and the rollout tokens/s above compare different work: a drafter changes which requests are left at "
            "the end, and the modes' different samples change how long responses run and so the share of a round "
            "that prefills its prompts (the same work in every mode); here every band compares equal batch sizes.",
            "",
            md(list(cells.values())),
        ]
    if t["lossless"]:
        lines += lossless_markdown(t["lossless"])
    if t.get("quarters"):
        labels = {key: (label, nd) for key, label, nd in QUARTER_METRICS}
        rows = [{"mode": r["mode"], "metric": labels[r["metric"]][0],
                 **{f"Q{i}": cell(r[f"q{i}"], f".{labels[r['metric']][1]}f") for i in range(1, 5)}}
                for r in t["quarters"]]  # fmt: skip
        lines += ["", "## By quarter of the run", "", "Means over each quarter of the training steps.", "", md(rows)]
    if t.get("seeds"):
        lines += seeds_markdown(t["seeds"], t["seeds_vs_off"], t.get("off_vs_off", []))
    lines += ["", "![acceptance](acceptance.png)", "", "![throughput](throughput.png)", ""]
    lines += ["![reward and length](reward_length.png)", "", "![drift](drift.png)", "", "![timeline](timeline.png)", ""]
    return "\n".join(lines)


def verdict(r: dict) -> str:
    """A mode's lossless-in-training verdict: ``yes`` where reward and length are shown equivalent and no greedy
    accuracy differs at :data:`ALPHA`, ``NO`` where any differs, ``not shown`` otherwise."""
    verdicts = [r["score_verdict"], r["length_verdict"]]
    greedy = [r[k] for k in r if k.endswith("_greedy_p")]
    if "differs" in verdicts or any(p < ALPHA for p in greedy):
        return "NO"
    return "yes" if all(v == "equivalent" for v in verdicts) else "not shown"


def lossless_markdown(rows: list[dict]) -> list[str]:
    """The lossless-in-training section: per-step reward and length against spec off's by TOST on paired steps, and
    the final greedy accuracy by Fisher's exact test."""
    table = []
    for r in rows:
        row = {"mode": r["mode"]}
        for name, label, unit in (("score", "reward", ""), ("length", "response length", "%")):
            scale = 100 if unit else 1
            row[label] = f"{cell(r[f'{name}_mean'], '.3f')} ({cell(r[f'{name}_off'], '.3f')})"
            row[f"{label}: paired difference [90%]"] = (
                f"{cell(scale * r[f'{name}_difference'], '+.3f')}{unit} "
                f"[{cell(scale * r[f'{name}_low'], '+.3f')}, {cell(scale * r[f'{name}_high'], '+.3f')}]"
            )
            row[f"{label}: verdict"] = r[f"{name}_verdict"]
        for key in r:
            if key.endswith("_greedy_acc"):
                source = key.removesuffix("_greedy_acc")
                row[f"final greedy acc, {source} (off)"] = f"{cell(r[key], '.3f')} ({cell(r[f'{key}_off'], '.3f')})"
                row[f"{source}: p"] = cell(r[f"{source}_greedy_p"], ".3f")
        table.append(row | {"same learning": verdict(r)})
    margins = ", ".join(
        f"{key} ±{100 * m:.0f}% of spec off's mean" if relative else f"{key} ±{m:g}"
        for key, (m, relative) in EQUIVALENCE_MARGINS.items()
    )
    return [
        "",
        "## Lossless in training",
        "",
        f"Each mode against spec off, run with the same seed and data order: per-step reward (before filtering) and "
        f"response length by two one-sided tests (TOST) on the steps' paired differences (the {100 * (1 - 2 * EQUIVALENCE_ALPHA):.0f}% "
        f"interval of their mean, Newey-West error for their correlation over steps) against the margins {margins}: "
        f"'equivalent' inside them, 'differs' wholly outside, 'not shown' in between. Final greedy held-out accuracy: "
        f"Fisher's exact test on the problems solved (p below {ALPHA}: differs).",
        "",
        md(table),
    ]


SEED_COLUMNS = {
    "mode": ("mode", ""),
    "seed": ("seed", ""),
    "rollout_tok_s": ("rollout tok/s", ".0f"),
    "tail_tok_s": ("long-tail tok/s", ".0f"),
    "accept_len": ("tokens per request-step", ".2f"),
    "reward": ("mean reward (all generated)", ".3f"),
    "wall_clock_s": ("training time to the common step (s)", ".0f"),
    "decode_vs_off": ("decode speed vs off at equal work", ".2f"),
}
SEED_SUMMARY_COLUMNS = {
    "mode": ("mode", ""),
    "seeds": ("seeds", ""),
    "rollout_tok_s_vs_off": ("rollout tok/s vs off, same seed", ".2f"),
    "tail_tok_s_vs_off": ("long tail vs off", ".2f"),
    "decode_vs_off": ("decode speed vs off at equal work", ".2f"),
    "speedup_to_step": ("wall-clock to the common step, off's / the mode's", ".2f"),
    "reward_minus_off": ("mean reward - off's", "+.3f"),
    "reward_seed_spread": ("seed spread of the mean reward", ".3f"),
    "agrees": ("within the seed spread", ""),
}


def seeds_markdown(per_seed: list[dict], summary: list[dict], off_vs_off: list[dict]) -> list[str]:
    """The across-seeds section: every mode's runs side by side, each mode against spec off's runs, and spec off's
    runs against each other (the A/A control of the decode speed at equal work)."""
    lines = [
        "",
        "## Across seeds",
        "",
        f"Every run of every seed (means over its steps; training time summed to step {per_seed[0]['to_step']}, the "
        "last step every run reached; decode speed at equal work as in (c)), then each mode against spec off: speed "
        "ratios over the seeds both ran (geometric mean), and its mean reward over its seeds against spec off's, "
        "which must differ by no more than the larger of the two modes' ranges of per-seed means (the modes sample "
        "one distribution). The curves: `seeds.png`.",
        "",
        md(per_seed, SEED_COLUMNS),
    ]
    if summary:
        lines += ["", md(summary, SEED_SUMMARY_COLUMNS)]
    for r in off_vs_off:
        lines += ["", f"A/A control: spec off at seed {r['seed']} against spec off at seed {r['against_seed']} (the same "
                  f"code on other samples), decode speed at equal work: **{cell(r['vs_off'], '.2f')}x**. A mode's "
                  "decode ratio no further from 1.00 than this is inside the spread of the machine and the samples."]  # fmt: skip
    return lines + ["", "![every seed](seeds.png)"]


def seeds_plot(by_seed: dict[int, dict[str, list[dict]]], path: Path) -> None:
    """slime's per-step curves for every run of every seed (one colour per mode, one line style per seed): rollout
    time, long-tail time, tokens per request-step, reward, and the training time to each step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def tail_seconds(h: list[dict]) -> tuple[np.ndarray, np.ndarray]:
        rows = [r for r in h if "timing_s/gen" in r and "rollout/tail_time_share" in r]
        return np.array([r["step"] for r in rows]), np.array(
            [r["timing_s/gen"] * r["rollout/tail_time_share"] for r in rows]
        )

    def cumulative(h: list[dict]) -> tuple[np.ndarray, np.ndarray]:
        steps, seconds = series([r for r in h if r["step"] > 0], "timing_s/step")
        return steps, np.cumsum(seconds)

    panels = [
        ("rollout time per step (s)", lambda h: series(h, "timing_s/gen")),
        ("long-tail time per step (s)", tail_seconds),
        ("tokens per request-step", lambda h: series(h, "rollout/tokens_per_request_step")),
        ("mean reward (all generated)", lambda h: series(h, "train/gen_score_mean")),
        ("training time to the step (s)", cumulative),
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.8))
    names = dict.fromkeys(mode for by_mode in by_seed.values() for mode in by_mode)  # every run name, in order
    colours = {mode: f"C{i}" for i, mode in enumerate(names)}
    styles = ["-", "--", ":", "-."]
    for ax, (title, curve) in zip(axes, panels, strict=True):
        for s_i, (seed, by_mode) in enumerate(sorted(by_seed.items())):
            for mode, h in by_mode.items():
                steps, values = curve(h)
                if len(values):
                    ax.plot(steps, values, styles[s_i % len(styles)], color=colours[mode], lw=1.3,
                            label=f"{mode}, seed {seed}")  # fmt: skip
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


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
                             [m for m in runs if m != "off"]),
                            ("mtp/head_acc", "MTP head top-1 accuracy on the step's responses",
                             [m for m in runs if base_mode(m) in HEAD_MODES])]),
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
    acceptance against that drift: the starting head's and the run's head's expected acceptance on the probe (of an
    argmax and of a sampled draft), and vLLM's measured draft acceptance rate of the step's rollout."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for mode, h in runs.items():
        steps, kl = series(h, "drift/kl_from_start")
        if not len(kl):
            continue
        axes[0].plot(steps, kl, label=mode, lw=1.5)
        for key, style, name in (("drift/mtp_accept_start_head", ":", "starting head, argmax"),
                                 ("drift/mtp_accept_head", "-", "run's head, argmax"),
                                 ("drift/mtp_accept_sampled_start_head", "x:", "starting head, sampled"),
                                 ("drift/mtp_accept_sampled_head", "x-", "run's head, sampled"),
                                 ("rollout/spec_draft_acceptance_rate", ".", "vLLM measured")):  # fmt: skip
            if base_mode(mode) not in HEAD_MODES and "start_head" not in key:
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
    shown = ""  # the rollout's file name, for the title
    for mode in ("off", "sam", "sam_own"):
        by_step = saved_timelines(runs_dir / mode / "timelines")
        files = by_step[max(by_step)][:1] if by_step else []  # the last step's first round (first server's)
        if not files:
            continue
        shown = files[-1].stem
        steps = json.loads(files[-1].read_text())["steps"]
        t = np.array([s["start_s"] + s["duration_s"] for s in steps])
        active = np.array([s["active"] for s in steps])
        tok_s = np.array([s["tokens"] / max(s["duration_s"], 1e-9) for s in steps])
        axes[0].step(t, active, where="post", label=mode)
        axes[1].plot(t, np.convolve(tok_s, np.ones(5) / 5, mode="same"), label=mode, lw=1)
    axes[0].set_title(f"active requests ({shown})", fontsize=10)
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

    return {
        step: [RolloutTimeline.load(p) for p in paths] for step, paths in saved_timelines(run_dir / "timelines").items()
    }


def run_config(run_dir: Path):
    """The recipe config a mode ran with (Hydra's copy in the run's ``hydra/`` folder)."""
    path = run_dir / "hydra" / ".hydra" / "config.yaml"
    if not path.is_file():
        raise SystemExit(f"[ab] {path} is missing: was {run_dir} made by this script?")
    return OmegaConf.load(path)


def histories(runs_dir: Path) -> dict[str, list[dict]]:
    """What each run under an A/B's (or one seed's) folder logged, by run name, runs that logged nothing left out."""
    return {m: h for m in modes_on_disk(runs_dir) if (h := read_history(runs_dir / m))}


def decode_by_active(run_dirs: dict[str, Path]) -> list[dict]:
    """The decode steps of each run (name -> folder) pooled by active requests, against those of the run named
    ``off`` in the same band (:func:`speed_by_active_requests_vs_off`)."""
    by_step = {m: load_timelines(d) for m, d in run_dirs.items()}
    return speed_by_active_requests_vs_off(
        {m: [tl for step in sorted(tls) for tl in tls[step]] for m, tls in by_step.items()}, decode_only=True
    )


def off_against_off(by_active: dict[int, list[dict]]) -> list[dict]:
    """The A/B's A/A control: spec off of every later seed at equal work against spec off of the first seed that ran
    it, from each seed's bands (:func:`decode_by_active`). Two runs of the same code on different samples: how far
    from 1.00 the machine's drift and the samples alone move the decode speed at equal work."""
    offs = {s: off for s, bands in by_active.items() if (off := [b for b in bands if b["mode"] == "off"])}
    if len(offs) < 2:
        return []
    first, *later = offs
    return [
        {
            "seed": s,
            "against_seed": first,
            "vs_off": equal_work_vs_off(bands_vs_off({"off": offs[first], "again": offs[s]}))["again"],
        }
        for s in later
    ]


def report(name: str, runs_root: Path, out: Path, command: str, val_n: int | None) -> Path:
    """The A/B's tables and plots in ``out``; of a multi-seed A/B, the first seed's, and every seed's side by side."""
    seeds = seeds_on_disk(runs_root / name)
    by_seed = {s: histories(seed_dir(runs_root / name, s)) for s in seeds or [None]}
    first = seeds[0] if seeds else None  # the seed whose runs the tables show
    runs_dir, runs = seed_dir(runs_root / name, first), next(iter(by_seed.values()))
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
    out.mkdir(parents=True, exist_ok=True)
    t = tables(runs, val_n)
    by_active = {s: decode_by_active({m: seed_dir(runs_root / name, s) / m for m in r}) for s, r in by_seed.items()}
    t["by_active"] = by_active[first]
    decode_vs_off = {s: equal_work_vs_off(bands) for s, bands in by_active.items()}
    t["decode_vs_off"] = [{"mode": m, "vs_off": v} for m, v in decode_vs_off[first].items()]
    if seeds:
        t["seeds"], t["seeds_vs_off"] = across_seeds(by_seed, decode_vs_off)
        t["off_vs_off"] = off_against_off(by_active)
        seeds_plot(by_seed, out / "seeds.png")
    for key, rows in t.items():
        if rows:
            pd.DataFrame(rows).to_csv(out / f"{key}.csv", index=False)
    (out / "tables.json").write_text(json.dumps(t, indent=2))
    plots(runs, runs_dir, out)
    (out / "README.md").write_text(markdown(t, runs, command, tail_threshold, first))
    print((out / "README.md").read_text())
    return out
