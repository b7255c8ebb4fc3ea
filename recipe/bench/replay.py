"""The rollout replay (recipe/replay.py) checked against measured rollouts on the CPU, then applied to the models, GPUs
and response lengths users train with.

- ``cpu``: every rollout ``recipe.bench rollout`` recorded (its ``timelines.jsonl.gz``: each response's length, its
  prompts' lengths, the mode's tokens per request-step and draft tokens per request-step by band of active requests)
  replayed on the CPU step-cost fit (results/cost_model/fits.json, fitted on results/real/verify_cost's table, never on
  a rollout), times one scale for this machine and engine fixed on spec off's many-request rollouts (``--calibrate``)
  -> ``replay_cpu.csv`` (``mode, regime, measured, predicted``: rollout seconds, medians over repeats; regime
  ``whole``: the many-request rollouts, ``tail``: one prompt's samples, ``--tail-run``);
- ``gpu``: DAPO's shape (``--prompts`` x ``--n`` responses per node, long-tailed lengths up to each ``--max-tokens``)
  for Qwen3-8B and Qwen3-32B on an H100 and an H200, on the H200 fit carried to each shape, spec off against drafters
  that yield 1.1-3.0 tokens per request-step (K=1: an MTP head, its forward priced; K=4: a model-free drafter)
  -> ``replay_gpu.csv`` (``model, device, max_tokens, drafter, head, k, tokens_per_step, vs_off, tail_vs_off,
  tail_time_share``, ...): the table users read their own case from.

    python -m recipe.bench replay cpu --whole RUN/timelines.jsonl.gz --tail-run TAIL/timelines.jsonl.gz
    python -m recipe.bench replay gpu
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import math
from collections import defaultdict
from pathlib import Path

import numpy as np

from recipe.cost_model import (
    DEVICES,
    GPU_FIT,
    SHAPES,
    Device,
    ModelShape,
    StepCostFit,
    head_seconds,
    step_seconds,
    tensor_parallel,
)
from recipe.engine import HEAD_METHODS
from recipe.paths import RESULTS_DIR
from recipe.replay import ACTIVE_BANDS, SPEC_OFF, Drafter, StepCost, band_index, replay, response_lengths
from recipe.tables import markdown

OUT = RESULTS_DIR / "cost_model"
CPU_SHAPE, CPU_DEVICE = "smollm2-135m-fp32", "cpu-2core"
PAYOFF_MODES = ("sam", "hybrid")  # modes whose drafter drafts only where it pays (the replay decides the same way)
# GPU regime: what a DAPO node holds (the assumptions docs/gains.md states)
GPU_MEMORY = {"h100": 80e9, "h200": 141e9}  # bytes of HBM
MEMORY_UTILIZATION = 0.9  # vLLM's gpu_memory_utilization
TENSOR_PARALLEL = {"qwen3-8b": 1, "qwen3-32b": 2}  # GPUs per engine
GPUS_PER_NODE = 8
PROMPT_TOKENS = 512
MAX_NUM_SEQS = 256  # vLLM's default
TOKENS_PER_STEP = (1.1, 1.3, 1.5, 2.0, 2.5, 3.0)  # the sensitivity rows: a drafter's tokens per request-step


def cpu_fit() -> StepCostFit:
    fits = json.loads((OUT / "fits.json").read_text())
    return StepCostFit(**fits[CPU_DEVICE])


def write_csv(path: Path, rows: list[dict]) -> None:
    """``rows`` as CSV, floats to four significant digits."""
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows({k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in r.items()} for r in rows)


def read_timelines(path: Path) -> list[dict]:
    """The rollouts of a timelines file, up to the last one flushed where the run was stopped before closing it."""
    records = []
    with gzip.open(path, "rt") as fh:
        try:
            records.extend(json.loads(line) for line in fh if line.strip())
        except EOFError:
            pass
    return records


def by_band(timeline: dict) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per band of active requests (:data:`recipe.replay.ACTIVE_BANDS`), over the decode steps of a recorded timeline:
    tokens per request-step and draft tokens per request-step (1 and 0 where the band has no steps)."""
    steps = timeline["steps"]
    tokens, drafts = [], []
    for lo, hi in ACTIVE_BANDS:
        band = [s for s in steps if lo <= s["active"] <= hi and s["started"] == 0 and s["stepped"] > 0]
        stepped = sum(s["stepped"] for s in band)
        tokens.append(sum(s["tokens"] for s in band) / stepped if stepped else 1.0)
        drafts.append(sum(s["draft_tokens"] for s in band) / stepped if stepped else 0.0)
    return tuple(tokens), tuple(drafts)


def measured(timeline: dict) -> float:
    """A recorded rollout's seconds: its engine steps' durations."""
    return sum(s["duration_s"] for s in timeline["steps"])


def drafter_cost(
    shape: ModelShape, device: Device, fit_: StepCostFit, drafter: Drafter, verified: tuple[float, ...] | None = None
) -> StepCost:
    """The replay's step cost for ``drafter``: a step verifying ``k`` drafts (or, given ``verified``, the band's mean
    draft tokens per request, what a recorded drafter sent), plus an MTP head's forward (its layer and LM head, once
    per token of its ``k``-deep chain) on the steps that draft, where the drafter has a head: the hybrid runs its head
    only there (sam/hybrid.py; its layer on a prompt's prefill too, which the replay's one-token prefill step leaves
    out)."""

    def cost(batch: int, contexts: np.ndarray, k: int) -> float:
        drafted = (verified[band_index(batch)] if verified is not None else k) if k else 0
        seconds = step_seconds(shape, device, fit_, batch, contexts, drafted)
        if drafter.head and k:
            seconds += head_seconds(shape, device, fit_, batch, contexts, drafted, depth=drafter.k)
        return seconds

    return cost


def replay_recorded(record: dict, shape: ModelShape, device: Device, fit_: StepCostFit) -> float:
    """The rollout seconds the replay predicts for one recorded rollout: its responses' lengths, its
    prompts' mean length, its mode's tokens and draft tokens per request-step by band (a drafter verifies what it sent:
    its step is priced at the band's mean draft tokens per request, not at K) and its prompts prefilled as one step of
    one token per row."""
    timeline = record["timeline"]
    lengths = [length for length, _ in timeline["finishes"].values()]
    prompt = float(np.mean(record["prompt_tokens"]))
    tokens, drafts = by_band(timeline)
    mode = record["mode"].partition("#")[0]
    if mode == "off":
        drafter, drafted = SPEC_OFF, None
    else:
        drafter = Drafter(mode, 1, tokens, payoff=mode in PAYOFF_MODES, head=mode in HEAD_METHODS)
        drafted = drafts

    def prefill(n: int) -> float:
        return step_seconds(shape, device, fit_, int(round(n * prompt)), prompt / 2, 0)

    step = drafter_cost(shape, device, fit_, drafter, drafted)
    return replay(lengths, int(round(prompt)), drafter, step, max_num_seqs=len(lengths), prefill=prefill).seconds


def cpu(args: argparse.Namespace) -> None:
    shape, device, fit_ = SHAPES[CPU_SHAPE], DEVICES[CPU_DEVICE], cpu_fit()
    rows: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for regime, path in (("whole", args.whole), ("tail", args.tail_run)):
        if path is None:
            continue
        for record in read_timelines(path):
            rows[record["mode"], regime].append(
                (measured(record["timeline"]), replay_recorded(record, shape, device, fit_))
            )
    # one scale for this machine and engine against the table's: spec off's whole rollouts, measured over predicted
    scale = 1.0
    if args.calibrate != "none":
        pairs = rows.get((args.calibrate, "whole"))
        if not pairs:
            raise SystemExit(f"error: --calibrate {args.calibrate}: no whole rollouts of that mode in {args.whole}")
        scale = sum(m for m, _ in pairs) / sum(p for _, p in pairs)
    print(f"scale (measured over predicted, {args.calibrate}'s whole rollouts): {scale:.3f}")
    out = []
    for (mode, regime), pairs in rows.items():
        pairs = [(m, p * scale) for m, p in pairs]
        m, p = (float(np.median(x)) for x in zip(*pairs, strict=True))
        errors = [b / a - 1.0 for a, b in pairs if a > 0]
        fitted = "yes" if mode == args.calibrate and regime == "whole" else "no"
        out.append({"mode": mode, "regime": regime, "measured": m, "predicted": p, "error": float(np.median(errors)),
                    "error_min": min(errors), "error_max": max(errors), "repeats": len(pairs), "fitted": fitted,
                    "scale": scale})  # fmt: skip
    order = {"whole": 0, "tail": 1}
    out.sort(key=lambda r: (order[r["regime"]], r["mode"]))
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(args.out / "replay_cpu.csv", out)
    print(markdown(
        [[r["mode"], r["regime"], f"{r['measured']:.2f}", f"{r['predicted']:.2f}",
          f"{r['error']:+.1%} ({r['error_min']:+.1%} to {r['error_max']:+.1%}, {r['repeats']})", r["fitted"]]
         for r in out],
        ["mode", "regime", "measured s", "predicted s", "error (median of repeats; range, repeats)", "fitted"],
    ))  # fmt: skip


def measured_drafters(path: Path) -> list[Drafter]:
    """The real model's drafters as results/real measured them (whole rollout's tokens per request-step; acceptance
    does not depend on the hardware): ``mtp`` (its deepest chain, ``mtp/k4``) and ``suffix`` draft every step as
    vLLM's do, the hybrid sends the head's chain where the payoff rule expects it to pay (its head's yield is mtp's)."""
    if not path.is_file():
        return []
    rows: dict[str, dict] = {}
    for r in csv.DictReader(open(path)):  # a mode's variants (mtp/k1, mtp/k4; off#2): the deepest
        base = r["mode"].partition("/")[0].partition("#")[0]
        if base not in rows or int(r["k"]) > int(rows[base]["k"]):
            rows[base] = r
    out = []
    for mode in ("mtp", "suffix"):
        if mode in rows:
            r = rows[mode]
            tps = float(r["tokens_per_request_step"])
            k = max(1, round(float(r["draft_tokens_per_token"]) * tps))  # draft tokens a request-step verifies
            out.append(Drafter(mode, k, (tps,) * len(ACTIVE_BANDS), payoff=False, head=mode == "mtp"))
    if "mtp" in rows:
        out.append(Drafter("hybrid", out[0].k, out[0].tokens_per_step, head=True))
    return out


def gpu_engine(shape_name: str, device_name: str) -> tuple[Device, int]:
    """An engine's device (tensor parallelism as that many GPUs' peaks) and the KV cache it holds, in tokens."""
    shape, device, tp = SHAPES[shape_name], DEVICES[device_name], TENSOR_PARALLEL[shape_name]
    weights = (shape.matmul_params + shape.vocab * shape.hidden) * shape.bytes_per_param
    kv_tokens = int((MEMORY_UTILIZATION * GPU_MEMORY[device_name] * tp - weights) / shape.kv_bytes_per_token)
    return tensor_parallel(device, tp), kv_tokens


def gpu(args: argparse.Namespace) -> None:
    rows = []
    for shape_name in ("qwen3-8b", "qwen3-32b"):
        shape = SHAPES[shape_name]
        for device_name in ("h100", "h200"):
            device, kv_tokens = gpu_engine(shape_name, device_name)
            engines = GPUS_PER_NODE // TENSOR_PARALLEL[shape_name]
            for max_tokens in args.max_tokens:
                lengths = response_lengths(args.prompts * args.n // engines, max_tokens, max_tokens / 4, 0.9, args.seed)
                # requests that fit the KV cache at their mean context: vLLM admits by the blocks held, and preempts
                # when they run out
                seqs = max(1, min(MAX_NUM_SEQS, kv_tokens // int(PROMPT_TOKENS + float(np.mean(lengths)))))

                base = replay(lengths, PROMPT_TOKENS, SPEC_OFF, drafter_cost(shape, device, GPU_FIT, SPEC_OFF),
                              max_num_seqs=seqs, tail=args.tail)  # fmt: skip
                # K=1: an MTP head (its forward priced), K=4: a model-free drafter
                drafters = [Drafter("payoff", k, (tps,) * len(ACTIVE_BANDS), head=k == 1) for k in (1, 4)
                            for tps in TOKENS_PER_STEP if tps <= k + 1] + measured_drafters(args.measured)  # fmt: skip
                for drafter in drafters:
                    cost = drafter_cost(shape, device, GPU_FIT, drafter)
                    r = replay(lengths, PROMPT_TOKENS, drafter, cost, max_num_seqs=seqs, tail=args.tail)
                    rows.append({
                        "model": shape_name, "device": device_name, "max_tokens": max_tokens, "max_num_seqs": seqs,
                        "drafter": drafter.name, "payoff": drafter.payoff, "head": drafter.head, "k": drafter.k,
                        "tokens_per_step": drafter.tokens_per_step[0], "vs_off": base.seconds / r.seconds,
                        "tail_vs_off": base.tail_seconds / r.tail_seconds if r.tail_seconds else math.nan,
                        "tail_time_share": base.tail_seconds / base.seconds,
                        "drafted_step_share": r.drafted_steps / r.steps, "off_rollout_s": base.seconds,
                    })  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(args.out / "replay_gpu.csv", rows)
    table = gpu_table(rows)
    (args.out / "replay_gpu.md").write_text(table)
    print(table, end="")


GPU_TABLE_COLUMNS = (("payoff", 1, 1.3), ("payoff", 1, 1.5), ("payoff", 1, 2.0), ("payoff", 4, 2.0),
                     ("payoff", 4, 3.0), ("mtp", None, None), ("hybrid", None, None), ("suffix", None, None))  # fmt: skip


def gpu_table(rows: list[dict]) -> str:
    """Markdown: per model, GPU and response budget, spec off's rollout time and each drafter's speed-up over it,
    whole rollout (long tail in brackets); a measured drafter of SmolLM2's that results/real has no row for is left
    out."""

    def label(name: str, k: int | None, tps: float | None) -> str:
        return f"K={k}, {tps:g} tok/step" if name == "payoff" else f"{name} (SmolLM2's)"

    drafters = {r["drafter"] for r in rows}
    columns = [c for c in GPU_TABLE_COLUMNS if c[0] in drafters]
    table = []
    for key in dict.fromkeys((r["model"], r["device"], r["max_tokens"]) for r in rows):
        group = [r for r in rows if (r["model"], r["device"], r["max_tokens"]) == key]
        cells = []
        for name, k, tps in columns:
            hit = [
                r
                for r in group
                if r["drafter"] == name and (k is None or (r["k"] == k and r["tokens_per_step"] == tps))
            ]
            cells.append(f"{hit[0]['vs_off']:.2f}x ({hit[0]['tail_vs_off']:.2f}x)" if hit else "-")
        first = group[0]
        table.append([*key, first["max_num_seqs"], f"{first['off_rollout_s']:.0f}", *cells])
    headers = [
        "model",
        "GPU",
        "max tokens",
        "requests at once",
        "off: rollout s",
        *(label(*c) for c in columns),
    ]
    return markdown(table, headers) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    p_cpu = sub.add_parser("cpu", help="predict recorded CPU rollouts (recipe.bench rollout's timelines.jsonl.gz)")
    p_cpu.add_argument("--whole", type=Path, default=None, help="timelines of the many-request rollouts")
    p_cpu.add_argument("--tail-run", type=Path, default=None, help="timelines of one prompt's samples (the tail run)")
    p_cpu.add_argument(
        "--calibrate",
        default="off",
        help="the mode whose whole rollouts fix one scale of this machine and engine against the cost table's ('none')",
    )
    p_cpu.add_argument("--out", type=Path, default=OUT)
    p_gpu = sub.add_parser("gpu", help="Qwen3-8B/32B on H100/H200 in DAPO's shape, by drafter yield")
    p_gpu.add_argument("--prompts", type=int, default=512)
    p_gpu.add_argument("--n", type=int, default=16)
    p_gpu.add_argument("--max-tokens", type=int, nargs="+", default=[8192, 16384, 32768])
    p_gpu.add_argument("--tail", type=int, default=8, help="long-tail threshold (active requests per engine)")
    p_gpu.add_argument("--seed", type=int, default=0)
    p_gpu.add_argument(
        "--measured", type=Path, default=RESULTS_DIR / "real" / "rollout_e2e.csv", help="the real model's drafters"
    )
    p_gpu.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if args.what == "cpu":
        missing = [str(p) for p in (args.whole, args.tail_run) if p is not None and not p.is_file()]
        if missing or (args.whole is None and args.tail_run is None):
            parser.error(f"cpu: no timelines at {', '.join(missing) or '(none given: --whole/--tail-run)'}")
        cpu(args)
    else:
        gpu(args)


if __name__ == "__main__":
    main()
