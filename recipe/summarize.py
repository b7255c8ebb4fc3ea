"""Copy a DAPO run's metrics and curves into ``results/<name>/`` with a short markdown summary.

python -m recipe.summarize runs/spec-rollout-dapo/sam results/demo --command "make demo"
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd

from recipe.dapo.drift import METRIC_LABELS
from recipe.tables import markdown


def problem_accuracy(path: Path) -> pd.Series:
    """Per held-out problem (its prompt), the mean accuracy of its samples in one of veRL's validation dumps."""
    return pd.read_json(path, lines=True).groupby("input")["acc"].mean()


PASSES = (("sampled (val_kwargs)", ""), ("greedy", "greedy"))  # evaluation pass -> its dumps' subfolder


def first_and_last(folder: Path) -> tuple[pd.Series, pd.Series, dict[int, pd.Series]] | None:
    """Per-problem accuracy at the first and last evaluation of one pass (paired on the problems both hold), and
    every evaluation's; None with fewer than two evaluations."""
    dumps = sorted(folder.glob("*.jsonl"), key=lambda p: int(p.stem))
    if len(dumps) < 2:
        return None
    by_step = {int(p.stem): problem_accuracy(p) for p in dumps}
    first, last = by_step[int(dumps[0].stem)].align(by_step[int(dumps[-1].stem)], join="inner")
    return first, last, by_step


def rise_p_value(differences: np.ndarray) -> float:
    """One-sided sign-flip permutation test of per-problem accuracy differences: problem difficulty cancels in a
    difference, and with no rise each difference's sign is a coin flip."""
    from scipy.stats import permutation_test

    test = permutation_test(
        (differences,),
        lambda d, axis: np.mean(d, axis=axis),
        permutation_type="samples",
        alternative="greater",
        n_resamples=20000,
        vectorized=True,
        random_state=0,
    )
    return float(test.pvalue)


def heldout_rise(validation_dir: Path) -> list[dict]:
    """Did held-out accuracy rise? For each evaluation pass (``<step>.jsonl``: val_kwargs, ``greedy/``), the
    first and last evaluation's accuracy per problem, paired, and :func:`rise_p_value` on the differences."""
    out = []
    for name, sub in PASSES:
        evaluations = first_and_last(validation_dir / sub)
        if evaluations is None:
            continue
        first, last, by_step = evaluations
        out.append({
            "pass": name, "problems": len(first), "first_step": min(by_step), "last_step": max(by_step),
            "first": float(first.mean()), "last": float(last.mean()),
            "p_value": rise_p_value((last - first).to_numpy()),
            "by_step": {step: float(acc.mean()) for step, acc in by_step.items()},
        })  # fmt: skip
    return out


def pooled_rise(validation_dirs: list[Path]) -> list[dict]:
    """The rise over runs that differ only in their seed, tested as one: per problem, its last-minus-first accuracy
    averaged over the runs, and :func:`rise_p_value` on those means (a rise each seed shows weakly can be
    significant together; one seed's luck is diluted)."""
    out = []
    for name, sub in PASSES:
        evaluations = [first_and_last(d / sub) for d in validation_dirs]
        if any(e is None for e in evaluations):
            continue
        rise = pd.concat([last - first for first, last, _ in evaluations], axis=1, join="inner").mean(axis=1)
        out.append({
            "pass": name, "runs": len(validation_dirs), "problems": len(rise),
            "first": [float(first.mean()) for first, _, _ in evaluations],
            "last": [float(last.mean()) for _, last, _ in evaluations],
            "mean_rise": float(rise.mean()), "p_value": rise_p_value(rise.to_numpy()),
        })  # fmt: skip
    return out


# the drift probe's columns and the engine's own acceptance in the same step
QUARTER_KEYS = (  # the run's metrics the summary averages by quarter of its steps
    "critic/score/mean", "train/gen_score_mean", "response_length/mean", "train/num_gen_batches",
    "rollout/throughput_tok_s", "rollout/tail_throughput_tok_s", "rollout/spec_accept_length", "timing_s/gen",
    "timing_s/step",
)  # fmt: skip
DRIFT_COLUMNS = (
    *METRIC_LABELS.items(),
    ("rollout/spec_draft_acceptance_rate", "engine: drafts accepted"),
    ("rollout/throughput_tok_s", "rollout tok/s"),
)


def drift_table(history: list[dict]) -> list[str]:
    """Per step, the drift probe's KL from the starting policy and both heads' expected acceptance on the current
    policy (the starting head is what a frozen-head run drafts with), beside what the engine accepted; no lines for a
    run without the probe."""
    rows = [r for r in history if "drift/kl_from_start" in r]
    if not rows:
        return []
    lines = [
        "",
        "Drift probe per step (expected acceptance of one draft token on the step's policy, over the starting policy's "
        "probe responses; the engine's acceptance is over the step's own rollout):",
        "",
        *markdown(
            [[r["step"], *(f"{r[key]:.3f}" if key in r else "-" for key, _ in DRIFT_COLUMNS)] for r in rows],
            ["step", *(name for _, name in DRIFT_COLUMNS)],
        ).splitlines(),
    ]
    return lines


def main() -> None:
    from recipe.dapo.report import PROBE_ACC, plot_run

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("out_dir")
    parser.add_argument("--command", default="", help="the command that produced the run (for the record)")
    parser.add_argument(
        "--seed-runs",
        nargs="*",
        default=[],
        help="run folders of the same config with other seeds: adds the held-out rise pooled over all of them",
    )
    args = parser.parse_args()
    run, out = Path(args.run_dir), Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    history = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    shutil.copy(run / "metrics.jsonl", out / "metrics.jsonl")
    plot_run(history, out / "curves.png", title=f"DAPO, {args.command}")

    def mean(key: str, rows: list[dict]) -> float:
        vals = [r[key] for r in rows if key in r]
        return float(np.mean(vals)) if vals else float("nan")

    steps = [r for r in history if r["step"] > 0]  # step 0: the evaluation before training
    quarter = max(1, len(steps) // 4)
    quarters = [steps[i * quarter : (i + 1) * quarter] for i in range(3)] + [steps[3 * quarter :]]
    probe_key = next((k for r in history for k in r if k.startswith(PROBE_ACC)), None)
    probes = [(r["step"], r[probe_key]) for r in history if probe_key and probe_key in r]
    total_s = sum(r.get("timing_s/step", 0.0) for r in history)
    lines = [
        f"# {out.name}: DAPO run",
        "",
        f"Produced by `{args.command}` ({len(steps)} steps, {total_s / 60:.1f} min of training steps on this machine).",
        "",
        "Means over each quarter of the run's steps:",
        "",
        *markdown(
            [[f"`{key}`", *(f"{mean(key, q):.3f}" for q in quarters if q)] for key in QUARTER_KEYS],
            ["metric", *(f"steps {q[0]['step']}-{q[-1]['step']}" for q in quarters if q)],
        ).splitlines(),
    ]
    for row in heldout_rise(run / "validation"):
        steps_line = ", ".join(f"step {k}: {v:.3f}" for k, v in row["by_step"].items())
        lines += [
            "",
            f"Held-out accuracy, {row['pass']}, {row['problems']} problems: {steps_line}. First -> last evaluation "
            f"{row['first']:.3f} -> {row['last']:.3f}, one-sided paired permutation test over problems p = "
            f"{row['p_value']:.4f}.",
        ]
    if args.seed_runs:
        runs = [run, *map(Path, args.seed_runs)]
        for row in pooled_rise([r / "validation" for r in runs]):
            pairs = ", ".join(f"{a:.3f} -> {b:.3f}" for a, b in zip(row["first"], row["last"], strict=True))
            lines += [
                "",
                f"Held-out accuracy, {row['pass']}, pooled over {row['runs']} seeds ({pairs}): mean rise "
                f"{row['mean_rise']:+.3f} over {row['problems']} problems, one-sided permutation test p = "
                f"{row['p_value']:.4f}.",
            ]
    if probes:
        lines += [
            "",
            f"Training reward on the fixed probe (`{probe_key}`: the first training prompts, sampled as in "
            "rollouts): " + ", ".join(f"step {s}: {v:.3f}" for s, v in probes) + ".",
        ]
    lines += drift_table(history)
    lines += [
        "",
        "`critic/score/mean` is the mean DAPO reward of the kept (non-zero-variance) groups; "
        "`train/gen_score_mean` the mean over everything generated, before filtering.",
        "",
        "![curves](curves.png)",
        "",
    ]
    (out / "README.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
