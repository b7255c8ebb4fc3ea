"""Rollout timeline: what the engine did at every step, and the long-tail metrics derived from it.

Per engine step: start time, duration, active requests, requests that emitted tokens, tokens emitted, the
speculative counters (drafts, draft tokens, accepted tokens) and the requests whose prefill ended in it. Per
request: its length and finish time.
The long tail is the part of a rollout where at most ``tail_threshold`` requests are active (the Ascend SAM
article's definition); slime's long-tail figure is the longest sample's tokens over the rollout time. The
tail's tokens/s per active request (tokens over request-seconds) compares tails that hold different numbers
of requests, as when a drafter changes which requests are left at the end.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from recipe.engine import add_per_pos


@contextlib.contextmanager
def timed(timing: dict[str, float], name: str):
    """Add the wall time of the block to ``timing[name]`` (veRL's ``timing_s/*`` metrics)."""
    start = time.perf_counter()
    yield
    timing[name] = timing.get(name, 0.0) + time.perf_counter() - start


@dataclass
class StepRecord:
    start_s: float
    duration_s: float
    active: int  # unfinished requests when the step began
    stepped: int  # requests that emitted tokens in this step
    tokens: int  # tokens emitted in this step (accepted drafts + one per stepped request)
    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    started: int = 0  # requests that emitted their first token in this step: it ran their prefill
    accepted_per_pos: list[int] = field(default_factory=list)  # accepted draft tokens at depth 1, 2, ...


@dataclass
class RolloutTimeline:
    num_requests: int
    steps: list[StepRecord] = field(default_factory=list)
    finishes: dict[str, tuple[int, float]] = field(default_factory=dict)  # request -> (length, finish time)
    drafter_s: float = float("nan")  # SAM's proposer's own seconds inside the steps (NaN: another drafter, or none)
    _last_spec: tuple[int, int, int] = (0, 0, 0)
    _last_per_pos: tuple[int, ...] = ()

    def step(
        self, start_s: float, duration_s: float, active: int, stepped: int, tokens: int, spec_total, started: int = 0
    ) -> None:
        """Record one engine step; ``spec_total`` is the cumulative SpecCounters since the rollout began."""
        total = (spec_total.num_drafts, spec_total.num_draft_tokens, spec_total.num_accepted_tokens)
        delta = [a - b for a, b in zip(total, self._last_spec, strict=True)]
        per_pos = list(add_per_pos(tuple(spec_total.accepted_per_pos), self._last_per_pos, -1))
        self._last_spec, self._last_per_pos = total, tuple(spec_total.accepted_per_pos)
        self.steps.append(
            StepRecord(start_s, duration_s, active, stepped, tokens, *delta, started=started, accepted_per_pos=per_pos)
        )

    def finish(self, request_id: str, length: int, time_s: float) -> None:
        self.finishes[request_id] = (length, time_s)

    def arrays(self) -> dict[str, np.ndarray]:
        """Each scalar field of the steps as an array, and ``accepted_per_pos`` as [steps, depth] (zeros past a
        step's own depth)."""
        keys = [k for k in StepRecord.__dataclass_fields__ if k != "accepted_per_pos"]
        out = {k: np.array([getattr(s, k) for s in self.steps], dtype=float) for k in keys}
        depth = max((len(s.accepted_per_pos) for s in self.steps), default=0)
        per_pos = np.zeros((len(self.steps), depth))
        for i, s in enumerate(self.steps):
            per_pos[i, : len(s.accepted_per_pos)] = s.accepted_per_pos
        out["accepted_per_pos"] = per_pos
        return out

    def summary(self, tail_threshold: int) -> dict[str, float]:
        """Throughput overall and in the long tail, acceptance, time share of the tail, and the counts that
        ``step_rollout_metrics`` pools over a step's rounds. A rollout without tail steps (its last step
        finished more than ``tail_threshold`` requests at once) has NaN tail ratios, not zeros."""
        if not self.steps:
            return {}
        a = self.arrays()
        tail = a["active"] <= tail_threshold
        decode = a["started"] == 0
        lengths = np.array([length for length, _ in self.finishes.values()]) if self.finishes else np.zeros(1)
        total_time = float(a["duration_s"].sum())
        c = {
            "rollout_time_s": total_time,
            "tokens": float(a["tokens"].sum()),
            "request_steps": float(a["stepped"].sum()),
            "drafts": float(a["drafts"].sum()),
            "draft_tokens": float(a["draft_tokens"].sum()),
            "accepted_tokens": float(a["accepted_tokens"].sum()),
            "tail_time_s": float(a["duration_s"][tail].sum()),
            "tail_tokens": float(a["tokens"][tail].sum()),
            # request-seconds of the tail: a tail request's own decode speed is the tail's tokens over these,
            # which differs from the tail's tokens/s when a drafter changes which requests are left at the end
            "tail_request_time_s": float((a["active"][tail] * a["duration_s"][tail]).sum()),
            "tail_request_steps": float(a["stepped"][tail].sum()),
            "tail_drafts": float(a["drafts"][tail].sum()),
            "tail_accepted_tokens": float(a["accepted_tokens"][tail].sum()),
            # steps that prefilled no request: a drafter changes only these, while prefill is the same work in
            # every mode and can take most of a CPU rollout of short responses (results/real/online_vs_frozen)
            "decode_time_s": float(a["duration_s"][decode].sum()),
            "decode_tokens": float(a["tokens"][decode].sum()),
            "engine_steps": float(len(self.steps)),
            "drafter_s": self.drafter_s,
            **{f"accepted_pos_{k}": float(v) for k, v in enumerate(a["accepted_per_pos"].sum(axis=0), start=1)},
        }
        return {**c, **rollout_ratios(c), "longest_sample_tok_s": ratio(float(lengths.max()), total_time, 0.0)}

    def to_json(self) -> dict:
        return {
            "num_requests": self.num_requests,
            "steps": [asdict(s) for s in self.steps],
            "finishes": {k: list(v) for k, v in self.finishes.items()},
            "drafter_s": self.drafter_s,
        }

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json()))

    @classmethod
    def load(cls, path: str | Path) -> RolloutTimeline:
        d = json.loads(Path(path).read_text())
        return cls(
            num_requests=d["num_requests"],
            steps=[StepRecord(**s) for s in d["steps"]],
            finishes={k: (int(v[0]), float(v[1])) for k, v in d["finishes"].items()},
            drafter_s=float(d.get("drafter_s", NAN)),
        )


NAN = float("nan")


def ratio(x: float, y: float, empty: float = NAN) -> float:
    """``x / y``, or ``empty`` (NaN unless given) when there is nothing to divide by."""
    return float(x / y) if y else empty


# bands of active requests for speed_by_active_requests: a lone straggler, the long tail, mid-size and full batches
ACTIVE_BANDS: tuple[tuple[int, int], ...] = ((1, 1), (2, 4), (5, 8), (9, 16), (17, 48), (49, 1 << 30))


def band_label(lo: int, hi: int) -> str:
    return str(lo) if lo == hi else (f"{lo}+" if hi >= 1 << 30 else f"{lo}-{hi}")


def speed_by_active_requests(
    timelines: Iterable[RolloutTimeline], bands: tuple[tuple[int, int], ...] = ACTIVE_BANDS, decode_only: bool = False
) -> list[dict[str, float | str]]:
    """Engine steps pooled by how many requests were active: each band's share of the rollout time, its
    tokens/s, tokens/s per active request and tokens per request-step. Two modes compared band by band are
    compared at equal batch size, which the long-tail tokens/s is not when a drafter changes how many
    requests are left at the end (and which ones). ``decode_only``: only the steps that prefilled no request."""
    sums = np.zeros((len(bands), 4))  # seconds, tokens, request-seconds, request-steps
    for tl in timelines:
        if not tl.steps:
            continue
        a = tl.arrays()
        counted = a["started"] == 0 if decode_only else np.ones(len(tl.steps), dtype=bool)
        for i, (lo, hi) in enumerate(bands):
            sel = counted & (a["active"] >= lo) & (a["active"] <= hi)
            d = a["duration_s"][sel]
            sums[i] += (d.sum(), a["tokens"][sel].sum(), (a["active"][sel] * d).sum(), a["stepped"][sel].sum())
    total = sums[:, 0].sum()
    return [
        {
            "active": band_label(lo, hi),
            "time_share": ratio(seconds, total),
            "tok_s": ratio(tokens, seconds),
            "request_tok_s": ratio(tokens, request_s),
            "tokens_per_request_step": ratio(tokens, request_steps),
        }
        for (lo, hi), (seconds, tokens, request_s, request_steps) in zip(bands, sums, strict=True)
    ]


def speed_by_active_requests_vs_off(
    timelines: dict[str, Iterable[RolloutTimeline]], decode_only: bool = False
) -> list[dict[str, float | str]]:
    """:func:`speed_by_active_requests` of each mode's rollouts, one row per mode and band, with the band's tokens/s
    per active request over spec off's (mode ``off``) in the same band (``request_tok_s_vs_off``; NaN without it).
    ``decode_only``: as in :func:`speed_by_active_requests`."""
    bands = {mode: speed_by_active_requests(tls, decode_only=decode_only) for mode, tls in timelines.items()}
    return bands_vs_off(bands)


def bands_vs_off(bands: dict[str, list[dict]]) -> list[dict[str, float | str]]:
    """Each mode's bands (:func:`speed_by_active_requests`) as rows of :func:`speed_by_active_requests_vs_off`: the
    mode named, and its tokens/s per active request over spec off's in the same band. Rows of that function
    given again are renamed and their ratio recomputed (the columns keep their order)."""
    off = bands.get("off")
    return [
        {"mode": mode, **band}
        | {"mode": mode, "request_tok_s_vs_off": ratio(band["request_tok_s"], off[i]["request_tok_s"]) if off else NAN}
        for mode, mode_bands in bands.items()
        for i, band in enumerate(mode_bands)
    ]


TIMELINE_NAME = re.compile(r"step_(\d+)_(?:server(\d+)_)?round_(\d+)\.json")


def timeline_path(folder: Path, step: int, round_index: int, server: int | None = None) -> Path:
    """Where a run keeps the timeline of one generation round: ``step_<step>_round_<r>.json`` (the local loop) or
    ``step_<step>_server<e>_round_<r>.json`` (one per vLLM server on backend=verl). :func:`saved_timelines` reads
    both."""
    engine = "" if server is None else f"server{server}_"
    return Path(folder) / f"step_{step:05d}_{engine}round_{round_index}.json"


def saved_timelines(folder: Path) -> dict[int, list[Path]]:
    """A run's timeline files by training step, in (server, round) order; both backends' names."""
    found: dict[int, list[tuple[int, int, Path]]] = {}
    for path in Path(folder).glob("step_*.json"):
        m = TIMELINE_NAME.fullmatch(path.name)
        if m:
            step, server, round_index = int(m[1]), int(m[2] or 0), int(m[3])
            found.setdefault(step, []).append((server, round_index, path))
    return {step: [p for _, _, p in sorted(files)] for step, files in sorted(found.items())}


def equal_work_vs_off(bands: list[dict[str, float | str]]) -> dict[str, float]:
    """Per mode, the whole rollout's speed over spec off's at spec off's mix of batch sizes: off's time in each band
    of active requests, rescaled by the mode's tokens/s per request there against off's. At T=1 any accepted or
    rejected draft changes which tokens a rollout samples, so two modes' rollouts differ in how many of their
    responses run long, and their own tokens/s differ by that luck; this ratio compares the same work. NaN
    without spec off's bands or where a mode has no step in a band off spends time in."""
    off = {i: b for i, b in enumerate(b for b in bands if b["mode"] == "off")}
    if not off:
        return {}
    per_mode: dict[str, list[dict]] = {}
    for band in bands:
        per_mode.setdefault(str(band["mode"]), []).append(band)
    out = {}
    for mode, mode_bands in per_mode.items():
        time = 0.0
        for i, band in enumerate(mode_bands):
            share = float(off[i]["time_share"])
            if share > 0:
                time += share / float(band["request_tok_s_vs_off"])
        out[mode] = ratio(1.0, time)
    return out


def rollout_ratios(c: dict[str, float]) -> dict[str, float]:
    """Throughputs, acceptance and tail shares from the counts of ``RolloutTimeline.summary`` (of one round,
    or summed over a step's rounds); NaN tail ratios when there was no tail."""
    tail = c["tail_time_s"] > 0
    return {
        "throughput_tok_s": ratio(c["tokens"], c["rollout_time_s"], 0.0),
        "tail_throughput_tok_s": ratio(c["tail_tokens"], c["tail_time_s"]),
        "tail_request_tok_s": ratio(c["tail_tokens"], c["tail_request_time_s"]),
        "tail_time_share": ratio(c["tail_time_s"], c["rollout_time_s"], 0.0),
        "decode_throughput_tok_s": ratio(c["decode_tokens"], c["decode_time_s"]),
        "prefill_time_share": 1.0 - ratio(c["decode_time_s"], c["rollout_time_s"], 1.0),
        "tail_tokens_share": ratio(c["tail_tokens"], c["tokens"], 0.0),
        "tokens_per_request_step": ratio(c["tokens"], c["request_steps"], 0.0),
        "tail_tokens_per_request_step": ratio(c["tail_tokens"], c["tail_request_steps"]),
        "spec_accept_length": 1.0 + ratio(c["accepted_tokens"], c["drafts"], 0.0),
        "tail_spec_accept_length": 1.0 + ratio(c["tail_accepted_tokens"], c["tail_drafts"], 0.0) if tail else NAN,
        "spec_draft_acceptance_rate": ratio(c["accepted_tokens"], c["draft_tokens"], 0.0),
        # the share of draft tokens that added a token to a response: an accepted draft of a response's last token (its
        # EOS) earns nothing, since the step emits that token anyway and the end cuts off the bonus token after it.
        # vLLM counts it as accepted; a head that learned where responses end gains acceptance there and no speed
        # (results/real/online_vs_frozen)
        "spec_draft_earned_rate": ratio(c["tokens"] - c["request_steps"], c["draft_tokens"], 0.0),
        # the drafter's share of the rollout time: on the embedded model a step is a few ms, so the proposer's own
        # work is what separates two SAM variants that accept alike (results/ab)
        "drafter_time_share": ratio(c["drafter_s"], c["rollout_time_s"]),
        **accept_rates_by_depth(c),
    }


def accept_rates_by_depth(c: dict[str, float]) -> dict[str, float]:
    """``accept_rate_pos_<k>``: the chance a depth-k draft token is accepted given depths 1..k-1 were, from the counts'
    ``accepted_pos_<k>`` (vLLM's accepted tokens per position) over the drafts that reached depth k (``drafts`` for
    k=1, else the accepted depth-(k-1) tokens). Exact where every draft has the same length (the head's K); a shorter
    draft (SAM's) that ended before depth k counts as not accepted there. NaN where no draft reached depth k.

    Example: 100 drafts of 3 tokens, 60 accepted at depth 1, 30 at 2, 24 at 3: rates 0.6, 0.5, 0.8."""
    out = {}
    reached = c.get("drafts", 0.0)
    k = 1
    while f"accepted_pos_{k}" in c:
        accepted = c[f"accepted_pos_{k}"]
        out[f"accept_rate_pos_{k}"] = ratio(accepted, reached)
        reached, k = accepted, k + 1
    return out


COUNT_KEYS = (
    "rollout_time_s", "tokens", "request_steps", "drafts", "draft_tokens", "accepted_tokens", "tail_time_s",
    "tail_tokens", "tail_request_time_s", "tail_request_steps", "tail_drafts", "tail_accepted_tokens", "drafter_s",
    "decode_time_s", "decode_tokens",
)  # fmt: skip


def step_rollout_metrics(rounds: list[dict[str, float]]) -> dict[str, float]:
    """``rollout/*`` metrics of one training step from the timeline summaries of its generation rounds,
    pooled: every ratio is over the step's summed counts (tokens/s over its total time, acceptance over all
    its drafts), so a short round weighs what it holds. Without a tail in any round the ``tail`` ratios are
    left out rather than logged as zeros that would drag a mean over steps down; the longest-sample figure
    is the mean of the rounds' (each round has its own longest sample)."""
    depth_keys = sorted({k for r in rounds for k in r if k.startswith("accepted_pos_")}, key=lambda k: int(k[13:]))
    ratios = rollout_ratios({k: sum(r.get(k, 0.0) for r in rounds) for k in (*COUNT_KEYS, *depth_keys)})
    ratios["longest_sample_tok_s"] = float(np.mean([r["longest_sample_tok_s"] for r in rounds]))
    return {f"rollout/{k}": v for k, v in ratios.items() if v == v}
