"""The rollout timeline recorded inside vLLM's servers (backend=verl), turned into the same ``RolloutTimeline``
and ``rollout/*`` metrics the local backend logs.

In a server, vLLM's ``AsyncLLM`` loads ``vllm.stat_logger_plugins`` entry points and calls each logger's
``record`` once per engine step with the scheduler's and the step's stats. :class:`ServerTimelineLogger` is one:
with ``SPEC_ROLLOUT_TIMELINE_DIR`` set (the veRL launcher sets it), it appends one row per engine step to
``engine-<host>-<pid>-<engine>.jsonl`` there: wall time, active requests, tokens emitted, the step's
speculative counts and the lengths of the requests it finished.

Rows are assigned to training steps by time: the job marks when veRL logs each step's metrics (step_marks.py),
so a step's rows lie between the previous mark and its own. Within that window a server's rows split into
rollouts where its queue drains; in a step that also validated, each server's last rollout is the validation and
is left out, as the local backend's metrics leave evaluation out. The windows are approximate: veRL's V1 replay
buffer refills while the previous step trains, so part of a step's generation can fall in the previous step's
window: a step's metrics can hold a refill round of the next step's generation or miss one of its own.
"""

from __future__ import annotations

import bisect
import json
import logging
import os
import socket
import threading
import time
from pathlib import Path

from recipe.dapo.canary import AcceptanceCanary
from recipe.dapo.step_marks import read_marks, step_windows
from recipe.dapo.timeline import RolloutTimeline, StepRecord, step_rollout_metrics, timeline_path
from sam.counts import TIMELINE_DIR_ENV  # the directory every server writes its rows to (re-exported)

FLUSH_ROWS = 256
CANARY_FILE = "canary.jsonl"  # the live canary's rows, one per checked step: {"step", "t", "launch", "warned_at", ...}

logger = logging.getLogger(__name__)


def _stat_logger_base() -> type:
    from vllm.v1.metrics.loggers import StatLoggerBase

    return StatLoggerBase


class ServerTimelineLogger(_stat_logger_base()):
    """vLLM stat logger (plugin) writing one row per engine step of a server; a no-op without the env var."""

    def __init__(self, vllm_config=None, engine_index: int = 0):
        directory = os.environ.get(TIMELINE_DIR_ENV)
        self.path = None
        if directory:
            Path(directory).mkdir(parents=True, exist_ok=True)
            self.path = Path(directory, f"engine-{socket.gethostname()}-{os.getpid()}-{engine_index}.jsonl")
        self.rows: list[dict] = []
        self.last_t: float | None = None
        self.busy = False

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0) -> None:
        if self.path is None or scheduler_stats is None or iteration_stats is None:
            return
        t = float(iteration_stats.iteration_timestamp)
        finished = iteration_stats.finished_requests
        running, waiting = scheduler_stats.num_running_reqs, scheduler_stats.num_waiting_reqs
        spec = scheduler_stats.spec_decoding_stats
        self.rows.append(
            {
                "t": t,
                # a step's duration: time since the previous step of the same rollout (0 for a rollout's first)
                "dt": t - self.last_t if self.busy and self.last_t is not None else 0.0,
                "active": running + waiting + len(finished),
                "tokens": int(iteration_stats.num_generation_tokens),
                "drafts": int(spec.num_drafts) if spec else 0,
                "draft_tokens": int(spec.num_draft_tokens) if spec else 0,
                "accepted_tokens": int(spec.num_accepted_tokens) if spec else 0,
                "accepted_per_pos": [int(x) for x in spec.num_accepted_tokens_per_pos] if spec else [],
                "started": len(iteration_stats.time_to_first_tokens_iter),  # requests whose prefill ended here
                "finished": [[str(f.request_id), int(f.num_generation_tokens)] for f in finished],
                "drained": running + waiting == 0,
            }
        )
        self.last_t, self.busy = t, running + waiting > 0
        if not self.busy or len(self.rows) >= FLUSH_ROWS:
            self.flush()

    def flush(self) -> None:
        if self.path is not None and self.rows:
            with self.path.open("a") as fh:
                fh.write("".join(json.dumps(r) + "\n" for r in self.rows))
            self.rows = []

    def log(self) -> None:
        self.flush()

    def log_engine_initialized(self) -> None:
        pass


def load_rows(directory: Path) -> dict[str, list[dict]]:
    """Every server's rows, by engine file name, in time order."""
    out = {}
    for path in sorted(directory.glob("engine-*.jsonl")):
        rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        out[path.stem] = sorted(rows, key=lambda r: r["t"])
    return out


def split_rollouts(rows: list[dict]) -> list[list[dict]]:
    """Consecutive rows up to and including the one where the server's queue drained."""
    rollouts, current = [], []
    for r in rows:
        current.append(r)
        if r["drained"]:
            rollouts.append(current)
            current = []
    if current:
        rollouts.append(current)
    return rollouts


def to_timeline(rows: list[dict]) -> RolloutTimeline:
    start = rows[0]["t"] - rows[0]["dt"]
    tl = RolloutTimeline(num_requests=sum(len(r["finished"]) for r in rows))
    for r in rows:
        tl.steps.append(
            StepRecord(
                r["t"] - r["dt"] - start,
                r["dt"],
                r["active"],
                # requests that emitted tokens: each emits one plus the drafts it had accepted
                r["tokens"] - r["accepted_tokens"],
                r["tokens"],
                r["drafts"],
                r["draft_tokens"],
                r["accepted_tokens"],
                started=r["started"],
                accepted_per_pos=r.get("accepted_per_pos", []),
            )
        )
        for rid, length in r["finished"]:
            tl.finish(rid, length, r["t"] - start)
    return tl


def draft_counts_by_step(
    drafters: list[list[dict]], engines: dict[str, list[dict]], windows: dict[int, tuple[float, float]], source: str
) -> dict[int, dict[str, tuple[int, int]]]:
    """Draft tokens sent and accepted in each step's window, by source: from the hybrid drafters' cumulative rows
    (sam/counts.py: ``drafter-*.jsonl``, one list per file) where there are any, else every server's timeline totals
    (engine rows by file) as ``source`` (the spec method's one source)."""
    out: dict[int, dict[str, tuple[int, int]]] = {}
    for step, (start, end) in windows.items():
        counts: dict[str, list[int]] = {}
        if drafters:
            for rows in drafters:
                times = [r["t"] for r in rows]
                at = [rows[i - 1] if i else None for i in (bisect.bisect_right(times, t) for t in (start, end))]
                for name, value in (at[1] or {}).items():
                    if name != "t":
                        before = (at[0] or {}).get(name, [0, 0])
                        total = counts.setdefault(name, [0, 0])
                        total[0] += value[0] - before[0]
                        total[1] += value[1] - before[1]
        else:
            rows = [r for engine in engines.values() for r in engine if start < r["t"] <= end]
            counts[source] = [sum(r["draft_tokens"] for r in rows), sum(r["accepted_tokens"] for r in rows)]
        out[step] = {name: (d, a) for name, (d, a) in counts.items()}
    return out


class JsonlTail:
    """The rows appended to a JSONL file since the last :meth:`read` (a line still being written waits for the next)."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset = path, 0

    def read(self) -> list[dict]:
        if not self.path.is_file():
            return []
        with self.path.open("rb") as fh:
            fh.seek(self.offset)
            data = fh.read()
        end = data.rfind(b"\n") + 1
        self.offset += end
        return [json.loads(x) for x in data[:end].splitlines() if x.strip()]


class LiveCanary:
    """The acceptance canary (recipe/dapo/canary.py) run by the launcher while a veRL job trains: every ``poll_s`` it
    reads the rows the servers and drafters appended and the steps the job marked (this launch's), checks each step
    as soon as its mark lands and the step still running on its drafts so far, so that a sync that broke the head is
    reported in the launcher's log while training goes on, not when the job ends (or never, when it fails). Each
    checked step's ``rollout/canary_*`` metrics and the time its warning was logged go to :data:`CANARY_FILE` as they
    are found: a launcher killed later loses none of them; :func:`canary_rows` reads them back.

    Example: the head broken by step 1's update is warned about during step 2's rollout once 50 of its draft tokens
    were judged, and step 2's row is written when the job marks step 2."""

    def __init__(self, out_dir: Path, source: str, launch: float, resumed_from: int, poll_s: float = 1.0) -> None:
        self.out_dir, self.source, self.launch, self.poll_s = Path(out_dir), source, launch, poll_s
        self.directory = self.out_dir / "server_timeline"
        self.canary = AcceptanceCanary()
        self.running_step = resumed_from + 1  # the step whose rollouts run now
        self.open_since = launch  # ... since this time (the previous mark)
        self.warned_at: dict[int, float] = {}  # step -> when its fall was logged
        self._tails: dict[Path, JsonlTail] = {}
        self._rows: dict[Path, list[dict]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="live-canary", daemon=True)

    def __enter__(self) -> LiveCanary:
        self.replay_earlier()
        self._thread.start()
        return self

    def replay_earlier(self) -> None:
        """A relaunch's canary starts from the levels an uninterrupted run would have: the steps up to the one it
        resumed from, checked again in order from what the earlier launches' servers wrote (no warning, no row)."""
        windows = step_windows(read_marks(self.out_dir))
        drafters, engines = self._read("drafter-*.jsonl"), dict(enumerate(self._read("engine-*.jsonl")))
        earlier = {s: w for s, w in windows.items() if s < self.running_step}
        for step, counts in sorted(draft_counts_by_step(drafters, engines, earlier, self.source).items()):
            self.canary.check(step, counts, warn=False)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.poll()  # the marks and rows the job wrote after the last poll

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.poll()
            except Exception:  # the job goes on without its canary; the failure is in the launcher's log
                logger.exception("live acceptance canary: a poll failed")

    def _read(self, pattern: str) -> list[list[dict]]:
        for path in sorted(self.directory.glob(pattern)):
            tail = self._tails.setdefault(path, JsonlTail(path))
            self._rows.setdefault(path, []).extend(tail.read())
        return [rows for path, rows in self._rows.items() if path.match(pattern)]

    def poll(self, now: float | None = None) -> None:
        """Check every step marked since the last poll, then the running step's drafts so far."""
        now = time.time() if now is None else now
        marks = [m for m in read_marks(self.out_dir) if m["launch"] == self.launch]
        drafters = self._read("drafter-*.jsonl")
        engines = dict(enumerate(self._read("engine-*.jsonl")))
        closed = {s: w for s, w in step_windows(marks).items() if s >= self.running_step}
        for step, window in sorted(closed.items()):
            counts = draft_counts_by_step(drafters, engines, {step: window}, self.source)[step]
            metrics = self.canary.check(step, counts, warn=step not in self.warned_at)
            if any(v for k, v in metrics.items() if k.endswith("_fell")):
                self.warned_at.setdefault(step, now)
            row = {"step": step, "t": now, "launch": self.launch, "warned_at": self.warned_at.get(step), **metrics}
            with (self.out_dir / CANARY_FILE).open("a") as fh:
                fh.write(json.dumps(row) + "\n")
            self.running_step, self.open_since = step + 1, window[1]
        if closed:  # rows before the running step are judged: keep a drafter's last one before it (its baseline)
            for path, rows in self._rows.items():
                first = bisect.bisect_right([r["t"] for r in rows], self.open_since)
                self._rows[path] = rows[max(first - 1, 0) :]
        step = self.running_step
        if step not in self.warned_at:
            counts = draft_counts_by_step(drafters, engines, {step: (self.open_since, now)}, self.source)[step]
            if self.canary.warn(step, counts):
                self.warned_at[step] = now


def canary_rows(out_dir: Path) -> dict[int, dict]:
    """The live canary's rows by step (:class:`LiveCanary`), a relaunch's replacing a killed launch's."""
    path = Path(out_dir) / CANARY_FILE
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.is_file() else []
    return {r["step"]: r for r in sorted(rows, key=lambda r: r["t"])}


def rollout_metrics_by_step(out_dir: Path, validated: set[int], tail_threshold: int) -> dict[int, dict[str, float]]:
    """``rollout/*`` metrics per training step from the servers' rows; timelines saved under ``timelines/``."""
    marks, directory = read_marks(out_dir), out_dir / "server_timeline"
    if not marks or not directory.is_dir():
        return {}
    windows = step_windows(marks)
    rows_by_engine = load_rows(directory)
    engines = {name: split_rollouts(rows) for name, rows in rows_by_engine.items()}
    saved = out_dir / "timelines"
    saved.mkdir(exist_ok=True)
    metrics = {}
    for step, (start, end) in sorted(windows.items()):
        if step == 0:
            continue
        summaries = []
        for e_i, rollouts in enumerate(rollouts for _, rollouts in sorted(engines.items())):
            inside = [r for r in rollouts if start < r[-1]["t"] <= end]
            if step in validated and inside:
                inside = inside[:-1]  # the step's validation, after its training rollouts
            for r_i, rows in enumerate(inside):
                tl = to_timeline(rows)
                tl.save(timeline_path(saved, step, r_i + 1, server=e_i))
                summary = tl.summary(tail_threshold)
                if summary:
                    summaries.append(summary)
        if summaries:
            metrics[step] = step_rollout_metrics(summaries)
    return metrics
