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
import os
import socket
from pathlib import Path

from recipe.dapo.canary import AcceptanceCanary
from recipe.dapo.step_marks import read_marks, step_windows
from recipe.dapo.timeline import RolloutTimeline, StepRecord, step_rollout_metrics, timeline_path
from sam.counts import TIMELINE_DIR_ENV  # the directory every server writes its rows to (re-exported)

FLUSH_ROWS = 256


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
    directory: Path, windows: dict[int, tuple[float, float]], engines: dict[str, list[dict]], source: str
) -> dict[int, dict[str, tuple[int, int]]]:
    """Draft tokens sent and accepted in each step's window, by source: from the hybrid drafters' cumulative rows
    (sam/counts.py: ``drafter-*.jsonl``) where there are any, else every server's timeline totals as ``source`` (the
    spec method's one source)."""
    drafters = [
        [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        for path in sorted(directory.glob("drafter-*.jsonl"))
    ]
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


def rollout_metrics_by_step(
    out_dir: Path, validated: set[int], tail_threshold: int, source: str | None = None
) -> dict[int, dict[str, float]]:
    """``rollout/*`` metrics per training step from the servers' rows; timelines saved under ``timelines/``. With the
    drafting ``source`` (the spec method), the acceptance canary's too (recipe/dapo/canary.py), its warnings logged
    as the metrics are collected."""
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
    if source is not None:
        canary = AcceptanceCanary()
        counts = draft_counts_by_step(directory, windows, rows_by_engine, source)
        for step in sorted(counts):
            if step in metrics:
                metrics[step].update(canary.check(step, counts[step]))
    return metrics
