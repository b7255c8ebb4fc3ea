"""When each training step of a veRL job ended, noted by the job itself.

The servers' timeline rows (server_timeline.py) are assigned to training steps by time, so every step needs the
wall time at which veRL logged its metrics. The job notes it: with :data:`STEP_MARKS_ENV` set (the launcher sets
it), veRL's file logger appends a mark to :data:`STEP_MARKS` each time it logs a step. Written inside the job,
not by the launcher watching the tracking file, so a job whose launcher was killed (kill -9 leaves it running
until a relaunch ends it) still marks every step it logs, and a resumed run's windows have no holes.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

STEP_MARKS = "step_marks.jsonl"  # {"step": k, "t": when step k's metrics were logged, "launch": t0, "resumed_from": S}
STEP_MARKS_ENV = "SPEC_ROLLOUT_STEP_MARKS"  # JSON {"path", "launch", "resumed_from"} of one launch


def marks_env(out_dir: Path, resumed_from: int) -> dict[str, str]:
    """The environment variable that makes a launch's job mark its steps in ``out_dir``."""
    spec = {"path": str(out_dir / STEP_MARKS), "launch": time.time(), "resumed_from": resumed_from}
    return {STEP_MARKS_ENV: json.dumps(spec)}


def mark_logged_steps() -> None:
    """Make veRL's file logger (``trainer.logger`` holds ``file``) append a step mark after each row it writes.
    Called by the veRL plugin in every veRL process; a no-op without :data:`STEP_MARKS_ENV`, idempotent."""
    spec = os.environ.get(STEP_MARKS_ENV)
    if not spec:
        return
    from verl.utils import tracking

    original = tracking.FileLogger.log
    if getattr(original, "_spec_rollout_marks", False):
        return
    launch = json.loads(spec)
    path = Path(launch.pop("path"))

    def log(self, data, step) -> None:
        original(self, data=data, step=step)
        with path.open("a") as fh:
            fh.write(json.dumps({"step": int(step), "t": time.time(), **launch}) + "\n")

    log._spec_rollout_marks = True
    tracking.FileLogger.log = log


def read_marks(out_dir: Path) -> list[dict]:
    path = out_dir / STEP_MARKS
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.is_file() else []


def step_windows(marks: list[dict]) -> dict[int, tuple[float, float]]:
    """Step -> (start, end) wall time: from the previous mark of the same launch (or the launch's start) to the
    step's own mark; a relaunch's marks replace the killed launch's for the steps after the one it resumed from."""
    windows: dict[int, tuple[float, float]] = {}
    previous: dict[float, float] = {}
    for m in sorted(marks, key=lambda m: m["t"]):
        start = previous.get(m["launch"], m["launch"])
        if int(m["step"]) > m["resumed_from"]:  # a relaunch's row for its resumed step adds to that step only
            windows[int(m["step"])] = (start, float(m["t"]))
        previous[m["launch"]] = float(m["t"])
    return windows
