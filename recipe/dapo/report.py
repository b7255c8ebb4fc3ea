"""What a run shows of its metrics: the console line per step, the curves, the end-of-run summary (the files they
read are :mod:`recipe.dapo.run_dir`'s)."""

from __future__ import annotations

from pathlib import Path

from recipe.dapo.run_dir import METRICS_FILE, checkpoint_dir, latest_step

PROBE_PREFIX = "val-aux/train_probe"  # metrics of the fixed training-prompt probe (recipe.train_probe)
PROBE_ACC = f"{PROBE_PREFIX}/acc/mean@"
PANELS = [
    ("train/gen_score_mean", "mean training reward (every generated response, before filtering)"),
    ("response_length/mean", "mean response length (tokens)"),
    ("rollout/throughput_tok_s", "rollout tokens/s"),
    ("rollout/spec_accept_length", "mean acceptance length"),
]


def held_out_keys(history: list[dict]) -> list[str]:
    """The run's held-out accuracy metrics (veRL's ``val-core/<data_source>/acc/...``)."""
    return sorted({k for h in history for k in h if k.startswith("val-core/") and "/acc/" in k})


def plot_run(history: list[dict], path: str | Path, title: str = "") -> Path:
    """Four panels over training steps: reward (with a running mean), length, rollout speed, acceptance."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(2, 2, figsize=(10, 6.5))
    for ax, (key, label) in zip(axes.flat, PANELS, strict=True):
        points = [(h["step"], h[key]) for h in history if key in h]
        if not points:
            ax.set_visible(False)
            continue
        steps, values = map(np.asarray, zip(*points, strict=True))
        ax.plot(steps, values, marker="o", ms=3, lw=1, label=label)
        if len(values) >= 4:
            window = max(2, len(values) // 6)
            smooth = np.convolve(values, np.ones(window) / window, mode="valid")
            ax.plot(steps[window - 1 :], smooth, lw=2, label=f"running mean ({window})")
        if key == "train/gen_score_mean":
            held_out = held_out_keys(history)
            probe = sorted({k for h in history for k in h if k.startswith(PROBE_ACC)})
            for extra, style in [*((k, "s--") for k in held_out), *((k, "D-") for k in probe)]:
                v = [(h["step"], 2 * h[extra] - 1) for h in history if extra in h]
                ax.plot(*zip(*v, strict=True), style, label=f"{extra} (as score: 2*acc-1)")
        ax.set_xlabel("step")
        ax.set_title(label, fontsize=10)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


STEP_LINE = [  # (metric, label, format): the console's line per step; every metric goes to the files
    ("train/gen_score_mean", "reward", "{:.3f}"),
    ("train/num_gen_batches", "rounds", "{:.0f}"),
    ("response_length/mean", "length", "{:.0f}"),
    ("rollout/throughput_tok_s", "rollout tok/s", "{:.0f}"),
    ("rollout/spec_accept_length", "accept", "{:.2f}"),
    ("drift/kl_from_start", "KL", "{:.3f}"),
    ("timing_s/step", "s/step", "{:.1f}"),
]


def step_line(step: int, total: int, metrics: dict[str, float]) -> str:
    """One readable console line for a training step."""
    parts = [f"step {step}/{total}"]
    parts += [f"{label} {fmt.format(metrics[key])}" for key, label, fmt in STEP_LINE if key in metrics]
    parts += [f"{key.removeprefix('val-core/')} {metrics[key]:.3f}" for key in held_out_keys([metrics])]
    return "  ".join(parts)


SUMMARY_SPEED = [  # (metric, label, format): the rollout figures of the end-of-run summary, means over steps
    ("rollout/throughput_tok_s", "rollout tokens/s", ".0f"),
    ("rollout/tail_throughput_tok_s", "in the long tail", ".0f"),
    ("rollout/decode_throughput_tok_s", "in the steps that prefilled nothing", ".0f"),
    ("rollout/spec_accept_length", "mean acceptance length", ".2f"),
]


def run_summary(history: list[dict], run_dir: Path) -> str:
    """What a run did, for the end of the console: reward first vs last quarter, held-out accuracy first vs last
    evaluation, rollout speed and acceptance, and where its files are."""
    import numpy as np

    steps = [h for h in history if h["step"] > 0]
    lines = [f"run finished: {len(steps)} training steps in {run_dir}"]

    def quarter_means(key: str) -> tuple[float, float] | None:
        values = [h[key] for h in steps if key in h]
        if not values:
            return None
        q = max(1, len(values) // 4)
        return float(np.mean(values[:q])), float(np.mean(values[-q:]))

    reward = quarter_means("train/gen_score_mean")
    if reward:
        lines.append(
            f"  training reward (train/gen_score_mean), first -> last quarter: {reward[0]:.3f} -> {reward[1]:.3f}"
        )
    for key in held_out_keys(history):
        evals = [(h["step"], h[key]) for h in history if key in h]
        (s0, v0), (s1, v1) = evals[0], evals[-1]
        lines.append(f"  held-out {key}: {v0:.3f} (step {s0}) -> {v1:.3f} (step {s1})")
    speed = [f"{label} {np.mean([h[key] for h in steps if key in h]):{spec}}" for key, label, spec in SUMMARY_SPEED
             if any(key in h for h in steps)]  # fmt: skip
    if speed:
        lines.append("  " + ", ".join(speed) + " (means over steps)")
    checkpoint = latest_step(run_dir)
    lines.append(f"  metrics: {run_dir / METRICS_FILE}  curves: {run_dir / 'curves.png'}")
    if checkpoint:
        lines.append(f"  last checkpoint: {checkpoint_dir(run_dir, checkpoint)}")
    return "\n".join(lines)
