"""The run directory (``trainer.default_local_dir``), laid out as veRL lays it out on both backends: checkpoints
``global_step_N/`` with veRL's resume pointer, veRL's file-logger output of each launch, the run's metric history
merged from those, and the console lines and plots of a run's metrics."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

LATEST_FILE = "latest_checkpointed_iteration.txt"  # veRL's resume pointer: the step of the last checkpoint
TRACKING_PREFIX = "tracking_from_step_"  # veRL's file logger, one file per launch, named by the step it resumed at
METRICS_FILE = "metrics.jsonl"  # the run's history: one row per step, merged from the launches' tracking files


def latest_step(run_dir: Path) -> int:
    """The step of the run's last checkpoint (0: none)."""
    latest = run_dir / LATEST_FILE
    return int(latest.read_text().strip()) if latest.is_file() else 0


def set_latest_step(run_dir: Path, step: int) -> None:
    """Point the resume pointer at ``step`` (replaced whole: a crash leaves the old pointer or the new one)."""
    tmp = run_dir / (LATEST_FILE + ".tmp")
    tmp.write_text(str(step))
    tmp.replace(run_dir / LATEST_FILE)


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    """Where the checkpoint of ``step`` lives (veRL's name)."""
    return run_dir / f"global_step_{step}"


def rewind_to_logged_checkpoint(run_dir: Path) -> int:
    """Point the resume pointer at the last checkpoint whose step's metrics were logged; its step is returned.

    veRL's trainer saves a step's checkpoint before it logs the step's metrics, so a job killed in between (a
    launcher killed outright leaves its job training until the relaunch ends it) leaves a checkpoint whose row no
    launch would write. Resuming from the checkpoint before it runs those steps again and logs them. With no such
    earlier checkpoint kept, the run resumes from the latest and the row stays missing, with a warning."""
    latest = latest_step(run_dir)
    logged = {row["step"] for row in merge_tracking(run_dir)}
    if latest == 0 or latest in logged:
        return latest
    earlier = [s for s in range(latest - 1, 0, -1) if s in logged and checkpoint_dir(run_dir, s).is_dir()]
    if not earlier:
        warnings.warn(
            f"{checkpoint_dir(run_dir, latest)}: step {latest} was saved but its metrics were never logged (the job "
            f"was killed in between) and no earlier logged checkpoint is kept; resuming from it, that row stays missing",
            stacklevel=2,
        )
        return latest
    set_latest_step(run_dir, earlier[0])
    print(
        f"resuming from {checkpoint_dir(run_dir, earlier[0])}: step {latest} was saved but its metrics were never "
        f"logged (the job was killed in between), so steps {earlier[0] + 1}-{latest} run again"
    )
    return earlier[0]


def tracking_path(run_dir: Path, start_step: int) -> Path:
    """Where veRL's file logger (``VERL_FILE_LOGGER_PATH``) writes for a launch that resumed at ``start_step``."""
    return run_dir / f"{TRACKING_PREFIX}{start_step}.jsonl"


def merge_tracking(run_dir: Path) -> list[dict]:
    """The run's rows (``{"step": s, **metrics}``, one per step) from its launches' tracking files: a launch resumed
    at step S replaces what earlier launches logged after S, so the history is what an uninterrupted run logs."""
    rows: dict[int, dict] = {}
    files = sorted(run_dir.glob(f"{TRACKING_PREFIX}*.jsonl"), key=lambda p: int(p.stem.removeprefix(TRACKING_PREFIX)))
    for path in files:
        start = int(path.stem.removeprefix(TRACKING_PREFIX))
        rows = {s: r for s, r in rows.items() if s <= start}
        for line in path.read_text().splitlines():
            if line.strip():
                entry = json.loads(line)
                step = int(entry["step"])
                rows[step] = {**rows.get(step, {"step": step}), **entry["data"]}
    return [rows[s] for s in sorted(rows)]


def write_history(run_dir: Path, history: list[dict]) -> None:
    """``metrics.jsonl``, replaced whole (its only writer, for both backends)."""
    tmp = run_dir / (METRICS_FILE + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in history))
    tmp.replace(run_dir / METRICS_FILE)


def read_history(run_dir: Path) -> list[dict]:
    """The run's ``metrics.jsonl`` ([] before its first step)."""
    path = run_dir / METRICS_FILE
    return [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []


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
