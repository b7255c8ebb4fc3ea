"""The run directory (``trainer.default_local_dir``), laid out as veRL lays it out on both backends: checkpoints
``global_step_N/`` with veRL's resume pointer, and the plots of a run's metrics written at the end of training."""

from __future__ import annotations

from pathlib import Path

LATEST_FILE = "latest_checkpointed_iteration.txt"  # veRL's resume pointer: the step of the last checkpoint


def latest_step(run_dir: Path) -> int:
    """The step of the run's last checkpoint (0: none)."""
    latest = run_dir / LATEST_FILE
    return int(latest.read_text().strip()) if latest.is_file() else 0


PROBE_PREFIX = "val-aux/train_probe"  # metrics of the fixed training-prompt probe (recipe.train_probe)
PROBE_ACC = f"{PROBE_PREFIX}/acc/mean@"
PANELS = [
    ("train/gen_score_mean", "mean training reward (every generated response, before filtering)"),
    ("response_length/mean", "mean response length (tokens)"),
    ("rollout/throughput_tok_s", "rollout tokens/s"),
    ("rollout/spec_accept_length", "mean acceptance length"),
]


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
            held_out = sorted({k for h in history for k in h if k.startswith("val-core/") and "/acc/" in k})
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
