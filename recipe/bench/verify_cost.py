"""What verifying drafts costs a vLLM engine step on this machine, by live batch size and draft length.

Speculative decoding pays when verifying K drafted tokens costs the target model little more than decoding one,
as on a GPU where a decode step is bound by reading the weights. This benchmark measures that premise where the
recipe's CPU numbers come from: for each batch size B it runs B requests of fixed length (``ignore_eos``) on
spec off and on vLLM's speculative path with a proposer that drafts exactly K tokens for every request at every
step, and reports the median engine-step time of the steady part (all B requests decoding) as a multiple of spec
off's. What a drafter must emit to break even is that multiple in tokens per request-step; ``--acceptance``
turns measured tokens per request-step at each K into the ceiling it implies (tokens per request-step over the
step's cost ratio). Engines stay alive side by side and the modes take turns, batch size by batch size.

``K=1of`` is the switch alone: one request of the batch drafts one token, the others none (vLLM then verifies the
whole batch through its rejection sampler instead of its plain sampler).

    python -m recipe.bench verify-cost [--batches 4,8,16,32,64,96 --ks 1,2,4,6,8 --repeats 5]
    python -m recipe.bench verify-cost --model smollm2-135m-instruct   # -> results/real
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import numpy as np

from recipe.paths import REPO_ROOT


def fixed_draft_spec(k: int | str) -> dict:
    """vLLM ``speculative_config`` of an engine drafting exactly ``k`` tokens a request ("1of": one request one)."""
    return {
        "method": "custom_class",
        "model": f"{__name__}.{'OneDraftProposer' if k == '1of' else 'FixedDraftProposer'}",  # importable by vLLM
        "num_speculative_tokens": 1 if k == "1of" else k,
    }


class FixedDraftProposer:
    """A custom_class proposer that drafts exactly K tokens (the last sampled one, repeated) for every request at
    every step, so a step verifies B x (1 + K) tokens whatever the acceptance."""

    def __init__(self, vllm_config, *args, **kwargs):
        self.k = vllm_config.speculative_config.num_speculative_tokens

    def load_model(self, *args, **kwargs) -> None:
        pass

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, *args, **kwargs) -> list[list[int]]:
        return [[int(token_ids_cpu[r, int(num_tokens_no_spec[r]) - 1])] * self.k for r in range(len(sampled_token_ids))]


class OneDraftProposer(FixedDraftProposer):
    """Drafts one token for the batch's first row only: the cost of switching a step to verification."""

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, *args, **kwargs) -> list[list[int]]:
        drafts = [[] for _ in sampled_token_ids]
        if drafts:
            drafts[0] = [int(token_ids_cpu[0, int(num_tokens_no_spec[0]) - 1])]
        return drafts


def steady_step_ms(timeline, batch: int) -> float:
    """Median step time while all ``batch`` requests decode (the prefill step and any step after the first
    request finished are left out)."""
    a = timeline.arrays()
    decoding = (a["active"] == batch) & (a["stepped"] == batch)
    decoding[0] = False  # the prefill step emits one token per request too
    return float(np.median(a["duration_s"][decoding]) * 1e3)


def main() -> None:
    from recipe.bench.rollout import rollout_inputs
    from recipe.dapo.rollout import RolloutEngine
    from recipe.engine import EngineOptions

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", default="4,8,16,32,64,96", help="live batch sizes (requests decoding at once)")
    parser.add_argument("--ks", default="1,2,4,6,8", help="draft lengths K to price")
    parser.add_argument("--tokens", type=int, default=48, help="tokens generated per request")
    parser.add_argument("--repeats", type=int, default=5, help="turns per mode and batch size; medians reported")
    parser.add_argument(
        "--acceptance",
        default="",
        help="K:tokens-per-request-step pairs measured end to end (e.g. 6:4.53,8:5.36): adds the ceiling they imply",
    )
    parser.add_argument("--model", default=None, help="a real model (recipe.models); default: the embedded base model")
    parser.add_argument("--out", default=None, help="default results/sam (embedded model) or results/real/verify_cost")
    args = parser.parse_args()
    try:
        batches = [int(b) for b in args.batches.split(",")]
        ks = [int(k) for k in args.ks.split(",")]
        emitted = {int(k): float(t) for k, t in (p.split(":") for p in args.acceptance.split(",") if p)}
    except ValueError as err:
        parser.error(f"--batches/--ks/--acceptance: {err}")
    if min(batches) < 1 or min(ks) < 1:
        parser.error("--batches and --ks take positive integers")
    if unpriced := set(emitted) - set(ks):
        parser.error(f"--acceptance names K={sorted(unpriced)} that --ks does not price")

    ckpt, ids, dtype = rollout_inputs(args.model, max(batches))
    if max(batches) > len(ids):
        parser.error(f"--batches: at most {len(ids)} (the test split's prompts)")
    sampling = {"temperature": 1.0, "top_p": 1.0, "max_tokens": args.tokens, "ignore_eos": True}
    options = EngineOptions(max_model_len=1024, seed=0, dtype=dtype)
    engines: dict = {0: RolloutEngine(str(ckpt), None, options, free_cache_engine=False)}
    for k in ["1of", *ks]:
        engines[k] = RolloutEngine(str(ckpt), fixed_draft_spec(k), options, free_cache_engine=False)
    for engine in engines.values():
        engine.generate(ids[: max(batches)], 1, sampling)  # every batch size's shapes seen once
    times: dict[tuple[int, int], list[float]] = {(b, k): [] for b in batches for k in engines}
    for rep in range(args.repeats):
        for b in batches:
            for k, engine in engines.items():
                times[b, k].append(steady_step_ms(engine.generate(ids[:b], 1, sampling).timeline, b))
        print(f"turn {rep + 1}/{args.repeats}", flush=True)
    for engine in engines.values():
        engine.close()

    rows = []
    for b in batches:
        off = float(np.median(times[b, 0]))
        for k in engines:
            ms = float(np.median(times[b, k]))
            rows.append({"batch": b, "k": k, "step_ms": ms, "cost_vs_off": ms / off})
    out = Path(args.out or REPO_ROOT / "results" / ("sam" if args.model is None else "real/verify_cost"))
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "verify_cost.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    cost = {(r["batch"], r["k"]): r for r in rows}
    lines = [
        "# Verification cost of a vLLM CPU engine step, by live batch size and draft length",
        "",
        "Produced by `python -m recipe.bench verify-cost "
        + (f"--model {args.model} " if args.model else "")
        + f"--batches {args.batches} --ks {args.ks} "
        f"--tokens {args.tokens} --repeats {args.repeats}"
        + (f" --acceptance {args.acceptance}" if args.acceptance else "")
        + f"`: B requests of {args.tokens} tokens each, every request drafted exactly K tokens at every step; "
        f"median steady step time over {args.repeats} interleaved turns, as a multiple of spec off's at the same B "
        "(= the tokens per request-step a drafter needs at that K just to break even). K=1of: one request of the "
        "batch drafts one token, the rest none (the price of switching a step to verification).",
        "",
        "| batch | spec off ms/step | K=1of | " + " | ".join(f"K={k}" for k in ks) + " |",
        "|---|---|---|" + "---|" * len(ks),
    ]
    for b in batches:
        cells = " | ".join(f"{cost[b, k]['cost_vs_off']:.2f}x" for k in ["1of", *ks])
        lines.append(f"| {b} | {cost[b, 0]['step_ms']:.2f} | {cells} |")
    if emitted:
        lines += [
            "",
            "Ceiling on the speed-up over spec off at each batch size, from tokens per request-step measured end to "
            "end (" + ", ".join(f"K={k}: {t:.2f}" for k, t in emitted.items()) + "): tokens per request-step / cost.",
            "",
            "| batch | " + " | ".join(f"K={k}" for k in emitted) + " |",
            "|---|" + "---|" * len(emitted),
        ]
        for b in batches:
            lines.append(
                f"| {b} | " + " | ".join(f"{t / cost[b, k]['cost_vs_off']:.2f}x" for k, t in emitted.items()) + " |"
            )
    (out / "verify_cost.md").write_text("\n".join(lines) + "\n")
    (out / "verify_cost.json").write_text(json.dumps({f"{b},{k}": v for (b, k), v in times.items()}, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
