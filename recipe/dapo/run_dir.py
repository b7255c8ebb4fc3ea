"""The run directory (``trainer.default_local_dir``), laid out as veRL lays it out on both backends: checkpoints
``global_step_N/`` with veRL's resume pointer, veRL's file-logger output of each launch, and the run's metric
history merged from those (what a resumed or crashed run picks up from)."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

LATEST_FILE = "latest_checkpointed_iteration.txt"  # veRL's resume pointer: the step of the last checkpoint
TRACKING_PREFIX = "tracking_from_step_"  # veRL's file logger, one file per launch, named by the step it resumed at
CHECKPOINT_PREFIX = "global_step_"  # veRL's checkpoint folders: global_step_<N>
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
    return run_dir / f"{CHECKPOINT_PREFIX}{step}"


def prune_checkpoints(run_dir: Path, keep: int | None) -> None:
    """``trainer.max_actor_ckpt_to_keep`` as veRL applies it: keep the newest ``keep`` checkpoints (None or <= 0:
    every one). The one the resume pointer names is never removed."""
    if keep is None or keep <= 0:
        return
    latest = latest_step(run_dir)
    names = (p.name.removeprefix(CHECKPOINT_PREFIX) for p in run_dir.glob(f"{CHECKPOINT_PREFIX}*"))
    steps = sorted(int(n) for n in names if n.isdigit())
    for step in steps[:-keep]:
        if step != latest:
            shutil.rmtree(checkpoint_dir(run_dir, step))


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
