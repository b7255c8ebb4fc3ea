"""End-to-end rollout benchmark with vLLM: spec off vs vLLM n-gram and suffix vs SAM variants, on the embedded base
model and its task (default) or on a real model (``--model smollm2-135m-instruct``: its word problems, written to
results/real).

``--repeats`` rollouts (``--prompts`` prompts x ``--n`` samples at temperature 1, the DAPO shape) per mode, on the same
prompts, each engine warmed up on other prompts first. Reports tokens/s and mean tokens per request-step
(the acceptance length, bonus token included) over the whole rollout and in its long tail (at most ``--tail``
active requests), from the engine-step timeline. SAM modes: own text only (``sam-own``); + group sharing (finished
siblings); + cross-epoch (the drafter saw an earlier rollout of the same prompts, as in the next DAPO epoch);
``suffix`` is vLLM's suffix decoding (Arctic Inference), shown the same earlier rollout as the cross-epoch SAM
modes (its global tree keeps earlier responses). ``@G`` sets a mode's gate (SAM drafts only while at most G requests
are active; default ``--gate``), ``/kK`` its draft length cap K, ``/s<B>x<K>`` a cap of <K> above <B> live requests
(vLLM's ``num_speculative_tokens_per_batch_size``; any model-free mode), and ``/<letter><value>`` a SAM option
(SAM_MODE_OPTIONS: ``/t`` tokens per match, ``/l`` lead tokens, ``/m`` min match, ``/o`` own bonus, ``/p`` min token
prob, ``/d`` prior decay, ``/c0`` first-occurrence drafts from group material, ``/r0`` from the request's own text,
``/y0`` every draft the match rules give instead of the payoff rule's, ``/g1`` drafts from every prompt's
responses too, ``/e1`` sources picked by the learned chances (``scored``); defaults: configs/spec/<method>.yaml).
``mtp`` drafts with the model's MTP head, ``hybrid`` with the head and SAM per request (``--head``: the checkpoint;
``hybrid`` takes SAM's letters too). ``sam`` is the default drafter as configs/spec/sam.yaml sets it (own text, siblings,
earlier epochs: ``sam+group+epoch``), ``sam-own`` its own text only. ``noop`` is vLLM's speculative path with a proposer that never drafts: the cost of the path itself. A name may end in
``#<tag>`` (``off,off#2``): a second engine of the same mode, the A/A control for what an engine instance alone changes.
Each rollout's summary goes to ``rollouts.jsonl``; the report ends with the rollouts a mode and a spec-off engine
sampled alike (``same_token_pairs``) and the drafting modes against each other repeat by repeat (``rival_pairs``),
which ``--pairs-from`` rebuilds from that file or from a run's printed lines.

    python -m recipe.bench rollout [--prompts 16 --n 8 --modes off,sam+group+epoch@256/k4/t1]
    python -m recipe.bench rollout --model smollm2-135m-instruct --modes off,suffix,sam+group+epoch
"""

from __future__ import annotations

import argparse
import csv
import gzip
import hashlib
import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from recipe.ab.stats import ratio_interval_text
from recipe.engine import HEAD_METHODS, SAM_METHODS
from recipe.paths import REPO_ROOT
from recipe.provenance import commit, machine

TIMELINES = "timelines.jsonl.gz"  # beside rollouts.jsonl: one line per rollout, its engine-step timeline

MODES = {  # mode -> (spec method, SAM options over configs/spec's); off, sam, mtp, hybrid, suffix: what spec=<mode> runs
    "off": ("off", None),
    "noop": ("noop", None),
    "ngram": ("ngram", None),
    "suffix": ("suffix", None),
    "sam": ("sam", {}),
    "sam-own": ("sam", {"group_sharing": False, "cross_epoch": False}),
    "sam+group": ("sam", {"group_sharing": True, "cross_epoch": False}),
    "sam+group+epoch": ("sam", {"group_sharing": True, "cross_epoch": True}),
    "mtp": ("mtp", None),
    "hybrid": ("hybrid", {}),
}


class NoDraftProposer:
    """A custom_class proposer that never drafts: the control that prices vLLM's speculative path itself."""

    def __init__(self, vllm_config, *args, **kwargs):
        pass

    def load_model(self, *args, **kwargs) -> None:
        pass

    def propose(self, sampled_token_ids, *args, **kwargs) -> list[list[int]]:
        return [[] for _ in sampled_token_ids]


SAM_MODE_OPTIONS = {  # letter of a SAM mode's "/<letter><value>" suffix -> (SAM option, type)
    "t": ("tokens_per_match", float),
    "l": ("lead_tokens", int),
    "m": ("min_match", int),
    "o": ("own_bonus", int),
    "p": ("min_token_prob", float),
    "d": ("prior_decay", float),
    "c": ("draft_from_counts", lambda v: bool(int(v))),
    "r": ("own_latest", lambda v: bool(int(v))),
    "y": ("payoff", lambda v: bool(int(v))),
    "g": ("global_sharing", lambda v: bool(int(v))),
    "e": ("scored", lambda v: bool(int(v))),
    "i": ("defer_idle", lambda v: bool(int(v))),
}


def parse_mode(
    name: str, default_gate: int, sam_defaults: dict
) -> tuple[str, int, dict | None, list[list[int]] | None] | None:
    """``base[@gate][/kK][/s<B>x<K>][/<letter><value>...][#tag]`` -> (method, K, SAM options, K-by-batch schedule),
    or None when the name is not a known mode. Every speculative mode takes ``/kK``, model-free ones ``/s``; only SAM
    modes take a gate and the SAM_MODE_OPTIONS letters. With ``/s`` the engine's K is the larger of the two; the tag
    names a second engine of the same mode."""
    from recipe.engine import K_BY_BATCH_KEY, VLLM_METHOD_KEYS, EngineOptions

    name, _, tag = name.partition("#")
    if "/" in tag or "@" in tag:
        return None  # the tag ends the name
    head, *suffixes = name.split("/")
    base_name, _, gate = head.partition("@")
    if base_name not in MODES:
        return None
    method, sam_opts = MODES[base_name]
    k = 0 if method == "off" else int(sam_defaults["k"][method])
    opts = {}
    above = None
    try:
        for suffix in suffixes:
            letter, value = suffix[:1], suffix[1:]
            if letter == "k" and method != "off":
                k = int(value)
            elif letter == "s" and K_BY_BATCH_KEY in VLLM_METHOD_KEYS.get(method, ()):
                batch, k_above = (int(v) for v in value.split("x"))
                above = (batch, k_above)
            elif letter in SAM_MODE_OPTIONS and method in SAM_METHODS:
                key, kind = SAM_MODE_OPTIONS[letter]
                opts[key] = kind(value)
            else:
                return None
        if gate and method not in SAM_METHODS:
            return None
        gate_value = int(gate) if gate else default_gate
    except ValueError:
        return None
    schedule = None
    if above is not None:
        batch, k_above = above
        schedule = [[1, batch, k], [batch + 1, EngineOptions().max_num_seqs, k_above]]
        k = max(k, k_above)
    if method not in SAM_METHODS:
        return method, k, None, schedule
    return method, k, {**sam_defaults["sam"], "batch_threshold": gate_value, **opts, **sam_opts}, schedule


def engine_spec(
    method: str, k: int, schedule: list[list[int]] | None = None, draft_sample_method: str | None = None
) -> dict | None:
    from recipe.dapo.config import spec_group
    from recipe.engine import K_BY_BATCH_KEY, spec_from_config

    if method == "noop":
        return {
            "method": "custom_class",
            "model": f"{__name__}.NoDraftProposer",
            "num_speculative_tokens": k,
        }
    # configs/spec/<method>.yaml, K and schedule set (and how the head's drafts are drawn, for the methods with a head)
    drawn = {"draft_sample_method": draft_sample_method} if draft_sample_method and method in HEAD_METHODS else {}
    return spec_from_config(spec_group(method, num_speculative_tokens=k, **{K_BY_BATCH_KEY: schedule}, **drawn))[0]


def mode_defaults() -> dict:
    """What every mode name starts from (:func:`parse_mode`): SAM's options from configs/spec before a mode's own,
    and each method's K as configs/spec sets it (noop prices the path at SAM's K)."""
    from omegaconf import OmegaConf

    from recipe.dapo.config import spec_group

    sam_cfg = spec_group("sam")
    return {
        "sam": OmegaConf.to_container(sam_cfg.sam),
        "k": {m: spec_group(m).num_speculative_tokens for m in ("ngram", "suffix", "sam", "mtp", "hybrid")}
        | {"noop": sam_cfg.num_speculative_tokens},
    }


def mode_engine(
    ckpt: Path,
    method: str,
    k: int,
    sam_opts: dict | None,
    schedule: list[list[int]] | None,
    dtype: str = "float32",
    memory_share: float | None = None,
    draft_sample_method: str | None = None,
):
    """A vLLM engine for one parsed mode (:func:`parse_mode`'s result), kept whole between rollouts; the head's drafts
    drawn by ``draft_sample_method`` (None: as configs/spec sets it)."""
    from omegaconf import OmegaConf

    from recipe.dapo.config import spec_group
    from recipe.dapo.rollout import RolloutEngine
    from recipe.engine import EngineOptions

    extra = {"sam": sam_opts} if sam_opts else None
    if method == "hybrid":
        extra["hybrid"] = OmegaConf.to_container(spec_group("hybrid").hybrid)
    return RolloutEngine(
        str(ckpt),
        engine_spec(method, k, schedule, draft_sample_method),
        EngineOptions(max_model_len=1024, seed=0, dtype=dtype, gpu_memory_utilization=memory_share),
        extra,
        free_cache_engine=False,
    )


def by_active_requests_table(bands: list[dict]) -> list[str]:
    """Markdown lines from ``speed_by_active_requests_vs_off``'s rows: every mode's engine steps pooled over its
    rollouts by active requests (recipe.dapo.timeline bands), tokens/s per active request and over spec off's in the
    same band. The long tail's tokens/s compares
    different requests when a drafter changes which ones are left at the end; a band compares equal batch sizes."""
    from recipe.dapo.timeline import ACTIVE_BANDS, band_label

    labels = [band_label(lo, hi) for lo, hi in ACTIVE_BANDS]
    cells: dict[str, list[str]] = {}
    for band in bands:
        speed, vs_off = band["request_tok_s"], band["request_tok_s_vs_off"]
        cell = (
            "-"
            if math.isnan(speed)
            else f"{speed:.0f} ({'-' if math.isnan(vs_off) else f'{vs_off:.2f}x'}, {band['time_share']:.2f})"
        )
        cells.setdefault(band["mode"], []).append(cell)
    return [
        "",
        "Tokens/s per active request by active requests, every rollout's steps pooled (vs spec off in the same band; "
        "time share of the band in parentheses; -: no step in that band):",
        "",
        "| mode | " + " | ".join(labels) + " |",
        "|---|" + "---|" * len(labels),
        *(f"| {mode} | " + " | ".join(row) + " |" for mode, row in cells.items()),
    ]


def band_columns(bands: list[dict]) -> dict[str, dict[str, float]]:
    """Per mode, ``tok_s_active_<lo>_<hi>``: tokens/s per active request in each band of active requests (the same
    bands, recipe.dapo.timeline.ACTIVE_BANDS, for every mode; NaN for a band without steps)."""
    from recipe.dapo.timeline import ACTIVE_BANDS

    out: dict[str, dict[str, float]] = {}
    for i, band in enumerate(bands):
        out.setdefault(band["mode"], {})[band_key(*ACTIVE_BANDS[i % len(ACTIVE_BANDS)])] = float(band["request_tok_s"])
    return out


def band_key(lo: int, hi: int) -> str:
    """The column of a band of active requests: ``tok_s_active_<lo>_<hi>`` (``inf`` for the open top band)."""
    return f"tok_s_active_{lo}_{'inf' if hi >= 1 << 30 else hi}"


def rollout_band_speeds(timeline) -> dict[str, float]:
    """One rollout's tokens/s per active request in each band (:func:`band_key`; NaN without a step there), what
    :func:`same_token_band_pairs` compares, and its share of the rollout's time in each (:func:`share_key`), what
    :func:`rival_pairs` weighs them by."""
    from recipe.dapo.timeline import ACTIVE_BANDS, speed_by_active_requests

    bands = speed_by_active_requests([timeline])
    out = {}
    for lohi, band in zip(ACTIVE_BANDS, bands, strict=True):
        out[band_key(*lohi)] = float(band["request_tok_s"])
        out[share_key(*lohi)] = float(band["time_share"])
    return out


def share_key(lo: int, hi: int) -> str:
    return band_key(lo, hi).replace("tok_s_active", "time_share_active")


def drafter_ms(before: np.ndarray | None, after: np.ndarray | None) -> dict[str, float]:
    """The drafter's own ms per engine step over a rollout (``drafter_ms_per_step``) and per band of scheduled rows
    (``drafter_ms_<lo>_<hi>``), from its [seconds, calls] by rows before and after it (NaN: not SAM, or no step in
    the band): whether its work lands on the cheap steps at the end of a rollout."""
    from recipe.dapo.timeline import ACTIVE_BANDS

    keys = ["drafter_ms_per_step", *(drafter_band_key(*lohi) for lohi in ACTIVE_BANDS)]
    if before is None or after is None:
        return dict.fromkeys(keys, math.nan)
    seconds, calls = after - before
    spans = [slice(0, None), *(slice(lo, hi + 1) for lo, hi in ACTIVE_BANDS)]
    return {
        key: 1000 * seconds[span].sum() / calls[span].sum() if calls[span].sum() else math.nan
        for key, span in zip(keys, spans, strict=True)
    }


def _sent_on_worker(worker) -> list | None:
    """Runs in a vLLM worker: the hybrid drafter's draft tokens sent by source and scheduled rows (None otherwise)."""
    sent = getattr(getattr(worker.model_runner, "drafter", None), "sent_by_rows", None)  # spec off: no drafter
    return None if sent is None else sent.tolist()


def drafted_by_source(engine) -> np.ndarray | None:
    """[source (head, SAM), scheduled rows]: draft tokens a hybrid engine sent so far (None for other drafters)."""
    sent = engine.llm.collective_rpc(_sent_on_worker)[0]
    return None if sent is None else np.asarray(sent, dtype=float)


def head_shares(before: np.ndarray | None, after: np.ndarray | None) -> dict[str, float]:
    """A hybrid rollout's share of draft tokens from the MTP head, over the rollout (``head_share``) and per band of
    scheduled rows (``head_share_<lo>_<hi>``; NaN: no draft there, or not a hybrid): which source drafted where."""
    from recipe.dapo.timeline import ACTIVE_BANDS

    keys = ["head_share", *(head_share_key(*lohi) for lohi in ACTIVE_BANDS)]
    if before is None or after is None:
        return {}
    head, sam = after - before
    spans = [slice(0, None), *(slice(lo, hi + 1) for lo, hi in ACTIVE_BANDS)]
    return {
        key: head[span].sum() / (head[span].sum() + sam[span].sum()) if head[span].sum() + sam[span].sum() else math.nan
        for key, span in zip(keys, spans, strict=True)
    }


def head_share_key(lo: int, hi: int) -> str:
    return band_key(lo, hi).replace("tok_s_active", "head_share")


def drafter_band_key(lo: int, hi: int) -> str:
    return band_key(lo, hi).replace("tok_s_active", "drafter_ms")


def drafter_ms_table(runs: dict[str, list[dict]]) -> list[str]:
    """Markdown: each SAM mode's own ms per engine step in each band of scheduled rows, the median over its rollouts
    with steps in the band (-: none)."""
    caption = (
        "The drafter's own ms per engine step by scheduled requests (median over the rollouts with steps in the band; "
        "inside the step time; -: none):"
    )
    return _band_median_table(runs, drafter_band_key, caption, "{:.3f}")


def head_share_table(runs: dict[str, list[dict]]) -> list[str]:
    """Markdown: each hybrid mode's share of draft tokens from the MTP head (the rest SAM's) in each band of scheduled
    rows, the median over its rollouts that drafted there (-: no draft)."""
    caption = "Hybrid: the MTP head's share of the draft tokens sent, by scheduled requests (the rest SAM's; -: none):"
    return _band_median_table(runs, head_share_key, caption, "{:.2f}")


def _band_median_table(runs: dict[str, list[dict]], key_of, caption: str, fmt: str) -> list[str]:
    """Markdown: per mode that logged ``key_of(lo, hi)`` for some band, the median over its rollouts in each band."""
    from recipe.dapo.timeline import ACTIVE_BANDS

    keys = [key_of(*lohi) for lohi in ACTIVE_BANDS]
    lines = []
    for name, summaries in runs.items():
        values = [np.array([s.get(key, math.nan) for s in summaries], dtype=float) for key in keys]
        if not any(np.isfinite(v).any() for v in values):
            continue  # the mode's drafter does not log it
        cells = [fmt.format(np.nanmedian(v)) if np.isfinite(v).any() else "-" for v in values]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return band_table_head(caption) + lines if lines else []


def band_table_head(caption: str) -> list[str]:
    """Markdown: a caption and the head of a table with a column per band of active requests
    (recipe.dapo.timeline.ACTIVE_BANDS)."""
    from recipe.dapo.timeline import ACTIVE_BANDS, band_label

    return ["", caption, "", "| mode | " + " | ".join(band_label(*lohi) for lohi in ACTIVE_BANDS) + " |",
            "|---|" + "---|" * len(ACTIVE_BANDS)]  # fmt: skip


def spec_off_engines(runs: dict) -> list[str]:
    """The spec-off engines of a run (``off``, ``off#<tag>``), in the run's order: the first is the reference."""
    return [name for name in runs if name.partition("#")[0] == "off"]


def tokens_hash(responses) -> str:
    """A digest of a rollout's sampled token ids, response by response in request order: two rollouts sampled the same
    tokens where their digests agree (as many tokens is not enough: drafts can change tokens and keep the count)."""
    digest = hashlib.sha256()
    for r in responses:
        digest.update(np.asarray(r.token_ids, dtype=np.int64).tobytes() + b"|")
    return digest.hexdigest()[:16]


def _same_tokens(o: dict, m: dict) -> bool:
    """Whether two rollouts' summaries sampled the same tokens: their :func:`tokens_hash` digests agree (logs written
    before rollouts kept one: as many tokens)."""
    if "tokens_hash" in o and "tokens_hash" in m:
        return o["tokens_hash"] == m["tokens_hash"]
    return o["tokens"] == m["tokens"]


def _paired(runs: dict[str, list[dict | None]], name: str, off: str) -> dict[int, tuple[dict, dict]]:
    """(spec off's, the mode's) summaries by repeat, where both engines ran the repeat and sampled the same tokens."""
    if off == name:
        return {}
    return {rep: (o, m) for rep, (o, m) in enumerate(zip(runs[off], runs[name], strict=False))
            if o is not None and m is not None and _same_tokens(o, m)}  # fmt: skip


def _per_repeat(runs: dict[str, list[dict | None]], name: str, offs: list[str], ratio) -> list[float]:
    """One ratio per repeat: the geometric mean of ``ratio(off's summary, the mode's)`` over the spec-off engines it
    pairs with in that repeat (each off engine's pair shares the mode's rollout, so a repeat counts once in an
    interval). A ratio that is NaN or not positive (a band without steps) is left out."""
    by_rep: dict[int, list[float]] = {}
    for off in offs:
        for rep, (o, m) in _paired(runs, name, off).items():
            value = ratio(o, m)
            if value > 0:  # NaN compares False
                by_rep.setdefault(rep, []).append(value)
    return [math.exp(np.mean(np.log(by_rep[rep]))) for rep in sorted(by_rep)]


def same_token_pairs(runs: dict[str, list[dict | None]]) -> list[str]:
    """Markdown: each mode against each spec-off engine (``off``, ``off#<tag>``) over the repeats where both sampled the
    same tokens (one sampler seed per repeat; :func:`_same_tokens`: these pairs compare the same work), as spec off's rollout time over the mode's; pooled over all its pairings by geometric mean, and
    per repeat with its 95% interval (the A/A engine's row gives the spread with nothing changed)."""
    offs = spec_off_engines(runs)
    if not offs:
        return []
    lines = [
        "",
        "Rollouts of the same tokens: each repeat where a mode and a spec-off engine sampled the same token ids (same seed),"
        " spec off's rollout time over the mode's (pairs, geometric mean, range); per repeat: the repeats with a pair,"
        " the geometric mean over them and its 95% interval (Student's t on the logs):",
        "",
        "| mode | " + " | ".join(f"vs {off}" for off in offs) + " | all pairs | per repeat [95% interval] |",
        "|---|" + "---|" * (len(offs) + 2),
    ]
    for name in runs:
        if name in offs[:1]:
            continue
        cells, pooled = [], []
        for off in offs:
            ratios = [o["rollout_time_s"] / m["rollout_time_s"] for o, m in _paired(runs, name, off).values()]
            pooled += ratios
            cells.append(
                f"{len(ratios)}, {math.exp(np.mean(np.log(ratios))):.3f}x, {min(ratios):.3f}-{max(ratios):.3f}"
                if ratios
                else "-"
            )
        total = f"{len(pooled)}, **{math.exp(np.mean(np.log(pooled))):.3f}x**" if pooled else "-"
        repeats = _per_repeat(runs, name, offs, lambda o, m: o["rollout_time_s"] / m["rollout_time_s"])
        per_repeat = f"{len(repeats)}, {ratio_interval_text(repeats)}" if repeats else "-"
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {total} | {per_repeat} |")
    return lines + same_token_band_pairs(runs, offs)


def same_token_band_pairs(runs: dict[str, list[dict | None]], offs: list[str]) -> list[str]:
    """Markdown: over the pairs of :func:`same_token_pairs`, each band's tokens/s per active request (the mode's over
    spec off's, geometric mean over every spec-off engine's pairs where both had steps in the band; pairs and range
    in parentheses), and a second table with one ratio per repeat and its 95% interval. A pair that sampled the same
    tokens holds the same requests in each band for about the same steps, so this compares the bands at equal work,
    without the pooled table's luck of which rollouts ran long. Empty for rollouts logged without their bands."""
    from recipe.dapo.timeline import ACTIVE_BANDS

    keys = [band_key(*lohi) for lohi in ACTIVE_BANDS]
    if not all(keys[0] in s for summaries in runs.values() for s in summaries if s is not None):
        return []
    lines = band_table_head(
        "The same pairs by active requests: tokens/s per active request, the mode's over spec off's in each band "
        "(geometric mean over all pairs with steps in the band; pairs, range; -: none):"
    )
    intervals = band_table_head(
        "The same by repeat: one ratio per repeat (geometric mean over its spec-off engines), their geometric mean and "
        "95% interval (repeats in parentheses):"
    )
    for name in runs:
        if name in offs[:1]:
            continue
        pairs = [pair for off in offs for pair in _paired(runs, name, off).values()]
        cells, bounds = [], []
        for key in keys:
            ratios = [m[key] / o[key] for o, m in pairs if o[key] > 0 and m[key] > 0]  # NaN compares False
            cells.append(
                f"{math.exp(np.mean(np.log(ratios))):.3f}x ({len(ratios)}, {min(ratios):.2f}-{max(ratios):.2f})"
                if ratios
                else "-"
            )
            repeats = _per_repeat(runs, name, offs, lambda o, m, key=key: m[key] / o[key] if o[key] > 0 else math.nan)
            bounds.append(f"{ratio_interval_text(repeats)} ({len(repeats)})" if repeats else "-")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
        intervals.append(f"| {name} | " + " | ".join(bounds) + " |")
    return lines + intervals


def rival_ratios(runs: dict[str, list[dict | None]], name: str, rival: str) -> dict[str, list[float]]:
    """``name`` against ``rival``, one ratio per repeat (the two rollouts drew from one sampler seed, but drafts change
    which tokens they sample, so these are not the same work): tokens/s of the whole rollout, of its long tail, and at
    equal work: each band's tokens/s per active request weighed by the time the repeat's spec-off rollout spent in the
    band (the rival's without a spec-off engine), as recipe.dapo.timeline.equal_work_vs_off weighs the pooled bands.
    Bands where either mode had no step are left out of that weighing (a tail request alone is a coin toss per seed),
    a repeat with less than half its weight left is left out, as is one logged without the bands' time shares."""
    from recipe.dapo.timeline import ACTIVE_BANDS

    offs = spec_off_engines(runs)

    def get(summary: dict, key: str) -> float:
        return summary.get(key, math.nan)  # NaN: a rollout logged before the key was

    def equal_work(mode: dict, rival: dict, weights: dict | None) -> float:
        if weights is None:  # no spec-off rollout that repeat
            return math.nan
        time = covered = 0.0
        for lohi in ACTIVE_BANDS:
            share = get(weights, share_key(*lohi))
            speed_ratio = get(mode, band_key(*lohi)) / get(rival, band_key(*lohi))
            if share > 0 and speed_ratio > 0:  # NaN compares False: no share logged, or no step in the band
                time += share / speed_ratio
                covered += share
        return covered / time if covered >= 0.5 else math.nan

    measures = {
        "tokens/s": lambda m, r, w: get(m, "throughput_tok_s") / get(r, "throughput_tok_s"),
        "long-tail tokens/s": lambda m, r, w: get(m, "tail_throughput_tok_s") / get(r, "tail_throughput_tok_s"),
        "at equal work": equal_work,
    }
    weights = runs[offs[0]] if offs else runs[rival]
    triples = [
        (m, r, w) for m, r, w in zip(runs[name], runs[rival], weights, strict=False) if m is not None and r is not None
    ]
    return {
        label: [v for v in (measure(*triple) for triple in triples) if v > 0]  # NaN compares False
        for label, measure in measures.items()
    }


def rival_pairs(runs: dict[str, list[dict | None]]) -> list[str]:
    """Markdown: each drafting mode against each drafting mode after it (say, the default against vLLM suffix),
    :func:`rival_ratios`' geometric mean and 95% interval over the repeats."""
    offs = spec_off_engines(runs)
    modes = [name for name in runs if name not in offs]
    lines, measures = [], []
    for i, name in enumerate(modes):
        for rival in modes[i + 1 :]:
            ratios = rival_ratios(runs, name, rival)
            measures = list(ratios)
            cells = [f"{ratio_interval_text(v)} ({len(v)})" if v else "-" for v in ratios.values()]
            lines.append(f"| {name} | {rival} | " + " | ".join(cells) + " |")
    if not lines:
        return []
    reference = f"{offs[0]}'s" if offs else "the rival's"
    head = [
        "",
        "Drafting modes against each other, one ratio per repeat (both rollouts from the repeat's sampler seed; their "
        "tokens differ), geometric mean and 95% interval (repeats in parentheses); equal work weighs each band's "
        f"tokens/s per active request by {reference} time in the band that repeat, over the bands both modes had "
        "steps in:",
        "",
        "| mode | rival | " + " | ".join(measures) + " |",
        "|---|---|" + "---|" * len(measures),
    ]
    return head + lines


SPEC_NAMES = {  # the rows of a pooled table by the spec= option each engine ran (SAM modes by their configs/spec ways)
    "sam+group+epoch": "sam",  # the default: own text, siblings, earlier epochs, every prompt's responses
    "sam+group+epoch/e0/g0": "sam_longest",  # the longest match (spec.sam.scored=false spec.sam.global_sharing=false)
}


def rollout_row(summaries: list[dict], extra_medians: Sequence[str] = ()) -> dict[str, float]:
    """A mode's columns of ``rollout_e2e.csv`` from its rollouts' summaries: medians over the rollouts (NaN where a
    rollout has no tail, or was logged before a key existed) and acceptance and drafting pooled over all of them;
    ``extra_medians``: more summary keys, as medians; and each depth's acceptance, pooled
    (:func:`recipe.dapo.timeline.accept_rates_by_depth`)."""
    from recipe.dapo.timeline import accept_rates_by_depth

    def median(key: str) -> float:
        return float(np.nanmedian([s.get(key, math.nan) for s in summaries]))

    def total(key: str) -> float:
        return float(np.nansum([s.get(key, math.nan) for s in summaries]))

    depths = {k for s in summaries for k in s if k.startswith("accepted_pos_")}
    counts = {"drafts": total("drafts"), **{k: total(k) for k in depths}}
    return {
        "tokens": median("tokens"),
        "rollout_s": median("rollout_time_s"),
        "rollout_tok_s": median("throughput_tok_s"),
        "tail_tok_s": median("tail_throughput_tok_s"),
        "tail_request_tok_s": median("tail_request_tok_s"),
        "tail_time_share": median("tail_time_share"),
        "tokens_per_request_step": median("tokens_per_request_step"),
        "tail_tokens_per_request_step": median("tail_tokens_per_request_step"),
        "acceptance": total("accepted_tokens") / max(total("draft_tokens"), 1.0),
        "draft_tokens_per_token": total("draft_tokens") / max(total("tokens"), 1.0),
        **accept_rates_by_depth(counts),
        **{key: median(key) for key in extra_medians},
    }


def write_rows(path: Path, rows: list[dict]) -> None:
    """``rows`` as a csv, its columns every row's keys in first-seen order (modes draft to different depths: a depth a
    mode never reached is left empty)."""
    columns = list(dict.fromkeys(k for row in rows for k in row))
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns)
        writer.writeheader()
        writer.writerows({k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in row.items()} for row in rows)


def pooled_rows(runs: dict[str, list[dict | None]], tail_runs: dict[str, list[dict | None]] | None) -> list[dict]:
    """One row per mode of pooled runs (``--pairs-from``): medians of its rollouts' summaries in a run's
    ``rollout_e2e.csv`` columns, then the same-token ratio to spec off with its 95% interval (``vs_off*``) and the
    default against suffix at equal work (``vs_suffix_equal_work*``), and with ``tail_runs`` (one prompt's samples, the
    long tail as a run of its own) the same two as ``tail_run_*``."""
    from recipe.ab.stats import ratio_interval
    from recipe.dapo.timeline import ACTIVE_BANDS

    def interval(prefix: str, ratios: list[float]) -> dict[str, float]:
        centre, lo, hi = ratio_interval(ratios) if ratios else (math.nan,) * 3
        return {prefix: centre, f"{prefix}_lo": lo, f"{prefix}_hi": hi, f"{prefix}_repeats": len(ratios)}

    def versus(pool: dict[str, list[dict | None]], name: str, prefix: str) -> dict[str, float]:
        offs = spec_off_engines(pool)
        same = [] if name not in pool or name in offs[:1] else _per_repeat(
            pool, name, offs, lambda o, m: o["rollout_time_s"] / m["rollout_time_s"]
        )  # fmt: skip
        rival = "suffix" if name != "suffix" and "suffix" in pool and name in pool and name not in offs else None
        work = rival_ratios(pool, name, rival)["at equal work"] if rival else []
        return {**interval(f"{prefix}vs_off", same), **interval(f"{prefix}vs_suffix_equal_work", work)}

    defaults = mode_defaults()
    rows = []
    for name, summaries in runs.items():
        kept = [s for s in summaries if s is not None]
        parsed = parse_mode(name, 256, defaults)
        row = {
            "mode": SPEC_NAMES.get(name, name),
            "k": parsed[1] if parsed else math.nan,
            "rollouts": len(kept),
            **rollout_row(kept, [band_key(*lohi) for lohi in ACTIVE_BANDS]),
            **versus(runs, name, ""),
        }
        if tail_runs is not None:
            row.update(versus(tail_runs, name, "tail_run_"))
            tail_kept = [t for t in tail_runs.get(name, []) if t is not None]
            row["tail_run_tokens_per_request_step"] = rollout_row(tail_kept)["tokens_per_request_step"]
        rows.append(row)
    return rows


def read_rollouts(paths: list[Path]) -> dict[str, list[dict | None]]:
    """Per mode, its rollouts' summaries in repeat order, from ``rollouts.jsonl`` files or runs' printed
    ``<repeat> <mode> {summary}`` lines. Several runs are pooled one after the other, their repeats renumbered; a mode
    a run lacks has None in that run's repeats (so repeats stay aligned across modes)."""
    pooled: dict[str, list[dict | None]] = {}
    done = 0  # repeats of the runs read so far
    for path in paths:
        runs: dict[str, dict[int, dict]] = {}
        for line in path.read_text().splitlines():
            if line.startswith("{"):
                record = json.loads(line)
                rep, name = record.pop("repeat"), record.pop("mode")
            else:
                head = line.split(" ", 2)
                if len(head) < 3 or not head[0].isdigit() or not head[2].startswith("{"):
                    continue
                rep, name, record = int(head[0]), head[1], json.loads(head[2])
            runs.setdefault(name, {})[rep] = record
        if not runs:
            raise SystemExit(f"--pairs-from {path}: no rollout summaries in it")
        repeats = 1 + max(rep for by_rep in runs.values() for rep in by_rep)
        for name in runs:
            pooled.setdefault(name, [None] * done)
        for name, summaries in pooled.items():
            by_rep = runs.get(name, {})
            summaries += [by_rep.get(rep) for rep in range(repeats)]
        done += repeats
    return pooled


def write_pooled(out: Path, paths: list[Path], tail_paths: list[Path] | None) -> None:
    """Pool runs (:func:`read_rollouts`) into ``out``: their rollouts (``rollouts.jsonl``; with ``tail_paths``,
    ``rollouts_tail.jsonl`` too), the same-token pairs, rivals and the hybrid's sources by band
    (``same_token_pairs.md``) and one row per mode (``rollout_e2e.csv``, :func:`pooled_rows`)."""
    pools = {"rollouts.jsonl": read_rollouts(paths)}
    if tail_paths:
        pools["rollouts_tail.jsonl"] = read_rollouts(tail_paths)
    out.mkdir(parents=True, exist_ok=True)
    lines = []
    for file, runs in pools.items():
        with open(out / file, "w") as fh:
            fh.writelines(
                json.dumps({"repeat": rep, "mode": name, **s}) + "\n"
                for name, summaries in runs.items()
                for rep, s in enumerate(summaries)
                if s is not None
            )
        sources = ", ".join(str(path) for path in (paths if file == "rollouts.jsonl" else tail_paths))
        drafted = {name: [s for s in summaries if s is not None] for name, summaries in runs.items()}
        lines += [f"# Same-token pairs, pooled from {sources}", *same_token_pairs(runs), *rival_pairs(runs),
                  *head_share_table(drafted), ""]  # fmt: skip
    (out / "same_token_pairs.md").write_text("\n".join(lines))
    write_rows(out / "rollout_e2e.csv", pooled_rows(pools["rollouts.jsonl"], pools.get("rollouts_tail.jsonl")))
    print("\n".join(lines))


def rollout_inputs(model: str | None, max_prompts: int) -> tuple[Path, list[list[int]], str]:
    """Checkpoint, prompt ids and engine dtype: the embedded base model on its test split (float32, as the local
    trainer's rollouts), or a real model (recipe.models: a built-in name, .gguf or HF directory) on the held-out
    word problems (recipe.data.word_problems) in the dtype the recipe's real-model experiment samples in."""
    from omegaconf import OmegaConf

    from mtp.checkpoint import load_tokenizer
    from recipe.dapo.data import load_prompts

    if model is None:
        from recipe.sft.train import ensure_base_model

        ckpt = ensure_base_model(OmegaConf.load(REPO_ROOT / "configs" / "sft.yaml"))
        data, dtype = ckpt.parent / "data" / "test.parquet", "float32"
    else:
        from recipe.data.word_problems import write_splits
        from recipe.models import resolve_model

        ckpt = resolve_model(model)
        experiment = OmegaConf.load(REPO_ROOT / "configs" / "experiment" / "smollm2.yaml")
        data, dtype = write_splits()[1], str(experiment.actor_rollout_ref.rollout.dtype)
    _, ids = load_prompts(str(data), load_tokenizer(ckpt), 512, max_prompts)
    return ckpt, ids, dtype


def main() -> None:
    from recipe.dapo.timeline import equal_work_vs_off, speed_by_active_requests_vs_off

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--tail", type=int, default=8, help="long-tail threshold (active requests)")
    parser.add_argument("--gate", type=int, default=None, help="SAM's batch_threshold (default: --tail)")
    parser.add_argument(
        "--modes",
        default=",".join(MODES),
        help="comma-separated; a SAM mode may name its gate, K and options: sam+group@32/k4/t1/l3/m2/o-1/p0.05/c1",
    )
    parser.add_argument("--repeats", type=int, default=3, help="rollouts per mode (interleaved); medians reported")
    parser.add_argument(
        "--seed",
        type=int,
        default=1000,
        help="repeat r's sampler seed is seed + r (another seed: other rollouts to pool)",
    )
    parser.add_argument(
        "--model", default=None, help="a real model (built-in name, .gguf or HF dir); default: the embedded base model"
    )
    parser.add_argument("--max-tokens", type=int, default=None, help="response budget (default 768; real model 384)")
    parser.add_argument("--memory-share", type=float, default=None, help="vLLM gpu_memory_utilization (CPU: of RAM)")
    parser.add_argument(
        "--head-draft", choices=("greedy", "probabilistic"),
        help="how the mtp and hybrid modes' head draws its drafts (default: configs/spec's, mtp greedy, hybrid "
        "probabilistic; +experiment=smollm2 samples them)",
    )  # fmt: skip
    parser.add_argument(
        "--dtype",
        default=None,
        help="the engines' dtype (default: float32, or what configs/experiment/smollm2.yaml samples a real model in)",
    )
    parser.add_argument("--out", default=None, help="default results/sam (embedded model) or results/real")
    parser.add_argument(
        "--head",
        default=None,
        help="with mtp or hybrid modes: the checkpoint (or built-in head) with the model's MTP head every mode then runs "
        "on (default: the embedded model's own, a built-in model's shipped head, else artifacts/models/<model>-mtp)",
    )
    parser.add_argument(
        "--pairs-from",
        type=Path,
        nargs="+",
        default=None,
        help="only rebuild the same-token pairs and the modes against each other (<out>/same_token_pairs.md) and "
        "the table of modes (<out>/rollout_e2e.csv) from rollouts.jsonl files or runs' logs (several: pooled, repeats "
        "renumbered)",
    )
    parser.add_argument(
        "--tail-pairs-from",
        type=Path,
        nargs="+",
        default=None,
        help="with --pairs-from: runs of one prompt's samples (the long tail as a run of its own), pooled beside them",
    )
    args = parser.parse_args()
    out = Path(args.out or REPO_ROOT / "results" / ("sam" if args.model is None else "real"))
    if args.pairs_from is not None:
        write_pooled(out, args.pairs_from, args.tail_pairs_from)
        return

    ckpt, ids, dtype = rollout_inputs(args.model, 2 * args.prompts)
    dtype = args.dtype or dtype
    if any(
        MODES.get(name.partition("#")[0].partition("/")[0], ("",))[0] in HEAD_METHODS for name in args.modes.split(",")
    ):
        from mtp.checkpoint import has_mtp_layer
        from recipe.models import BUILTIN_HEADS, CACHE_DIR, resolve_model

        # every mode runs on the head's checkpoint (the same trunk), so that all of them sample the same model
        if args.head:
            head = resolve_model(args.head)
        elif args.model is None:
            head = ckpt
        elif f"{args.model}-mtp" in BUILTIN_HEADS:  # the head that ships for a built-in model
            head = resolve_model(f"{args.model}-mtp")
        else:
            head = CACHE_DIR / f"{ckpt.name}-mtp"
        if not has_mtp_layer(head):
            parser.error(
                f"--modes {args.modes}: {head} has no MTP layer (make mtp-head builds SmolLM2's; or --head DIR)"
            )
        ckpt = head
    # held-out prompts as they come (embedded task: term counts are Pareto-distributed, so a few long traces make the
    # long tail; word problems: the model rambles to the budget on some samples)
    warm, prompts = ids[: args.prompts], ids[args.prompts : 2 * args.prompts]
    max_tokens = args.max_tokens or (768 if args.model is None else 384)
    sampling = {"temperature": 1.0, "top_p": 1.0, "max_tokens": max_tokens}
    gate = args.tail if args.gate is None else args.gate
    defaults = mode_defaults()
    engines, ks = {}, {}
    for name in args.modes.split(","):
        parsed = parse_mode(name, gate, defaults)
        if parsed is None:
            parser.error(
                f"--modes: unknown mode {name!r}; known: {', '.join(MODES)} "
                "(SAM modes take @<gate>/k<K>/s<batch>x<K>/t<tokens>/l<lead>)"
            )
        method, ks[name], sam_opts, _ = parsed
        engine = mode_engine(
            ckpt, *parsed, dtype=dtype, memory_share=args.memory_share, draft_sample_method=args.head_draft
        )
        engine.generate(warm, args.n, sampling)  # same shape on other prompts: every batch size seen once
        if method == "suffix" or (sam_opts and sam_opts["cross_epoch"]):
            engine.generate(prompts, args.n, sampling)  # the previous epoch of the same prompts
        engines[name] = engine
    # modes interleaved, rollout by rollout, so machine noise and drift hit every mode alike, and their order rotated
    # each repeat: in a fixed order a mode always follows the same one, and pays for whatever that one leaves behind
    runs: dict[str, list[dict]] = {name: [] for name in engines}
    timelines: dict[str, list] = {name: [] for name in engines}
    out.mkdir(parents=True, exist_ok=True)
    rollout_log = open(out / "rollouts.jsonl", "w")  # written as the rollouts come, closed after the last
    # every rollout's engine-step timeline and its prompts' lengths: what `recipe.bench replay` predicts it from
    timeline_log = gzip.open(out / TIMELINES, "wt")
    prompt_tokens = [len(p) for p in prompts]
    for rep in range(args.repeats):
        names = list(engines)
        for name in names[rep % len(names) :] + names[: rep % len(names)]:
            engine = engines[name]
            engine.reseed(args.seed + rep)  # every mode's rollout of a repeat draws from the same sampler seed
            busy, sent = engine.drafter_busy(), drafted_by_source(engine)
            result = engine.generate(prompts, args.n, sampling)
            s = result.timeline.summary(args.tail)
            s["tokens_hash"] = tokens_hash(result.responses)
            s.update(drafter_ms(busy, engine.drafter_busy()))
            s.update(head_shares(sent, drafted_by_source(engine)))
            s.update(rollout_band_speeds(result.timeline))
            runs[name].append(s)
            timelines[name].append(result.timeline)
            print(rep, name, json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in s.items()}))
            rollout_log.write(json.dumps({"repeat": rep, "mode": name, **s}) + "\n")
            rollout_log.flush()
            timeline_log.write(
                json.dumps({"repeat": rep, "mode": name, "k": ks[name], "n": args.n, "prompt_tokens": prompt_tokens,
                            "timeline": result.timeline.to_json()}) + "\n"
            )  # fmt: skip
            timeline_log.flush()
    rollout_log.close()
    timeline_log.close()
    rows = []
    for name, summaries in runs.items():
        row = {"mode": name, "k": ks[name], **rollout_row(summaries)}
        row["ms_per_step"] = 1000 * row["rollout_s"] / float(np.nanmedian([s["engine_steps"] for s in summaries]))
        row["drafter_ms_per_step"] = float(np.nanmedian([s["drafter_ms_per_step"] for s in summaries]))
        rows.append(row)
    bands = speed_by_active_requests_vs_off(timelines)  # every mode's steps pooled by active requests, once
    columns, equal_work = band_columns(bands), equal_work_vs_off(bands)
    for row in rows:
        row.update(columns[row["mode"]])
        row["equal_work_vs_off"] = equal_work.get(row["mode"], math.nan)
    for engine in engines.values():
        engine.close()
    base = rows[0] if rows[0]["mode"] == "off" else None
    out.mkdir(parents=True, exist_ok=True)
    write_rows(out / "rollout_e2e.csv", rows)
    model_arg = f"--model {args.model} " if args.model else ""
    lines = [
        f"# End-to-end rollouts with vLLM CPU on {args.model or 'the embedded base model'}",
        "",
        f"Produced by `python -m recipe.bench rollout {model_arg}--max-tokens {max_tokens} "
        f"--prompts {args.prompts} --n {args.n} "
        f"--repeats {args.repeats} --tail {args.tail} --gate {gate} --modes {args.modes}"
        f"{f' --seed {args.seed}' if args.seed != parser.get_default('seed') else ''}"
        f"{f' --dtype {args.dtype}' if args.dtype else ''}{f' --head-draft {args.head_draft}' if args.head_draft else ''}"
        f"{f' --head {args.head}' if args.head else ''}` on {machine()} at commit {commit()} (engines in {dtype}, "
        "temperature 1, long tail = "
        f"at most {args.tail} active requests, SAM drafts at most {gate} active requests unless a mode says @G, K, "
        "SAM options from configs/spec unless a mode says /<letter><value> (SAM_MODE_OPTIONS); every mode's engine alive at once, "
        f"rollouts interleaved mode by mode in an order rotated each repeat, each repeat's rollouts from one sampler seed, medians of {args.repeats}). The tail columns read each mode's own tail, "
        "which holds the requests that mode drafted worst (a drafter changes which requests are left at the end); the "
        "table by active requests below compares equal batch sizes. `equal work` is the whole rollout at spec off's "
        "mix of batch sizes (recipe.dapo.timeline.equal_work_vs_off: at T=1 a draft changes which tokens a rollout "
        "samples, and with them how many responses run long); `drafter ms` the proposer's own time per engine step "
        "(SAM; inside the step time).",
        "",
        "| mode | K | tokens/s | vs off | equal work vs off | ms/step | drafter ms/step | tail tokens/s | tail vs off | "
        "tail tokens/s per request | vs off | tokens/request-step | tail tokens/request-step | tail time share | "
        "drafted per token | accepted |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def vs_base(r: dict, key: str) -> str:
        return f"{r[key] / base[key]:.2f}x" if base and base[key] else "-"

    for r in rows:
        lines.append(
            f"| {r['mode']} | {r['k'] or '-'} | {r['rollout_tok_s']:.0f} | {vs_base(r, 'rollout_tok_s')} | "
            f"{r['equal_work_vs_off']:.2f}x | {r['ms_per_step']:.1f} | {r['drafter_ms_per_step']:.2f} | "
            f"{r['tail_tok_s']:.0f} | {vs_base(r, 'tail_tok_s')} | {r['tail_request_tok_s']:.0f} | "
            f"{vs_base(r, 'tail_request_tok_s')} | {r['tokens_per_request_step']:.2f} | "
            f"{r['tail_tokens_per_request_step']:.2f} | {r['tail_time_share']:.2f} | "
            f"{r['draft_tokens_per_token']:.2f} | {r['acceptance']:.2f} |"
        )
    lines += by_active_requests_table(bands)
    lines += same_token_pairs(runs)
    lines += rival_pairs(runs)
    lines += drafter_ms_table(runs)
    lines += head_share_table(runs)
    (out / "rollout_e2e.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
