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
whole batch through its rejection sampler instead of its plain sampler). ``K=mtp`` (with ``--head``): vLLM's MTP
drafter, one token a step from the checkpoint's MTP layer: verifying one token plus the head's forward. Every engine
then runs on the head's checkpoint (the same trunk).

``--prompt-tokens`` prices the same cells at longer contexts: each request's prompt cut from the test prompts' tokens
run together, so every steady step holds that many tokens of KV cache and more (the step-cost model's context terms
are fitted on them, recipe/bench/cost_model.py).

    python -m recipe.bench verify-cost [--batches 4,8,16,32,64,96 --ks 1,2,4,6,8 --repeats 5]
    python -m recipe.bench verify-cost --model smollm2-135m-instruct --prompt-tokens 0,384   # -> results/real
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from recipe.paths import REPO_ROOT
from recipe.tables import markdown


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


def long_prompts(ids: list[list[int]], tokens: int, count: int) -> list[list[int]]:
    """``count`` prompts of ``tokens`` tokens each, cut one after another from ``ids`` run together (repeated as
    needed): every request then holds the same context, each of different text."""
    flat = [t for p in ids for t in p]
    flat *= -(-tokens * count // len(flat))
    return [flat[i * tokens : (i + 1) * tokens] for i in range(count)]


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
    from recipe.engine import EngineOptions, speculative_config

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", default="4,8,16,32,64,96", help="live batch sizes (requests decoding at once)")
    parser.add_argument("--ks", default="1,2,4,6,8", help="draft lengths K to price")
    parser.add_argument("--tokens", type=int, default=48, help="tokens generated per request")
    parser.add_argument(
        "--prompt-tokens",
        default="0",
        help="comma-separated prompt lengths, each its own table (0: the test prompts as they are)",
    )
    parser.add_argument(
        "--head", default=None, help="a checkpoint with an MTP layer: every engine runs on it, and K=mtp is priced"
    )
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
        prompt_lengths = [int(p) for p in args.prompt_tokens.split(",")]
        emitted = {int(k): float(t) for k, t in (p.split(":") for p in args.acceptance.split(",") if p)}
    except ValueError as err:
        parser.error(f"--batches/--ks/--prompt-tokens/--acceptance: {err}")
    if min(batches) < 1 or min(ks) < 1 or min(prompt_lengths) < 0:
        parser.error("--batches and --ks take positive integers, --prompt-tokens non-negative ones")
    if unpriced := set(emitted) - set(ks):
        parser.error(f"--acceptance names K={sorted(unpriced)} that --ks does not price")

    ckpt, ids, dtype = rollout_inputs(args.model, max(batches))
    if max(batches) > len(ids):
        parser.error(f"--batches: at most {len(ids)} (the test split's prompts)")
    if args.head is not None:
        from mtp.checkpoint import has_mtp_layer

        if not has_mtp_layer(args.head):
            parser.error(f"--head {args.head}: no MTP layer in its config.json (python -m mtp.graft writes one)")
        ckpt = Path(args.head)
    max_len = max(max(len(p) for p in ids), *prompt_lengths) + args.tokens + 8
    prompts = {p: long_prompts(ids, p, max(batches)) if p else ids for p in prompt_lengths}
    sampling = {"temperature": 1.0, "top_p": 1.0, "max_tokens": args.tokens, "ignore_eos": True}
    options = EngineOptions(max_model_len=max(1024, max_len), seed=0, dtype=dtype)
    engines: dict = {0: RolloutEngine(str(ckpt), None, options, free_cache_engine=False)}
    for k in ["1of", *ks]:
        engines[k] = RolloutEngine(str(ckpt), fixed_draft_spec(k), options, free_cache_engine=False)
    if args.head is not None:
        engines["mtp"] = RolloutEngine(str(ckpt), speculative_config("mtp", 1), options, free_cache_engine=False)
    for engine in engines.values():
        for p in prompt_lengths:
            engine.generate(prompts[p][: max(batches)], 1, sampling)  # every batch size's shapes seen once
    cells = [(p, b) for p in prompt_lengths for b in batches]
    times: dict[tuple, list[float]] = {(p, b, k): [] for p, b in cells for k in engines}
    for rep in range(args.repeats):
        for p, b in cells:
            for k, engine in engines.items():
                times[p, b, k].append(steady_step_ms(engine.generate(prompts[p][:b], 1, sampling).timeline, b))
        print(f"turn {rep + 1}/{args.repeats}", flush=True)
    for engine in engines.values():
        engine.close()

    rows = []
    for p, b in cells:
        off = float(np.median(times[p, b, 0]))
        # the steady steps' mean KV context: the prompts, and half of the decoded tokens
        context = float(np.mean([len(x) for x in prompts[p][:b]])) + args.tokens / 2
        for k in engines:
            ms = float(np.median(times[p, b, k]))
            rows.append({"prompt_tokens": p, "context": round(context, 1), "batch": b, "k": k, "step_ms": ms,
                         "cost_vs_off": ms / off})  # fmt: skip
    out = Path(args.out or REPO_ROOT / "results" / ("sam" if args.model is None else "real/verify_cost"))
    out.mkdir(parents=True, exist_ok=True)
    cost = {(r["prompt_tokens"], r["batch"], r["k"]): r for r in rows}
    priced = [k for k in engines if k != 0]
    lines = [
        "# Verification cost of a vLLM CPU engine step, by live batch size and draft length",
        "",
        "Produced by `python -m recipe.bench verify-cost "
        + (f"--model {args.model} " if args.model else "")
        + (f"--head {args.head} " if args.head else "")
        + f"--batches {args.batches} --ks {args.ks} --prompt-tokens {args.prompt_tokens} "
        f"--tokens {args.tokens} --repeats {args.repeats}"
        + (f" --acceptance {args.acceptance}" if args.acceptance else "")
        + f"`: B requests of {args.tokens} tokens each, every request drafted exactly K tokens at every step; "
        f"median steady step time over {args.repeats} interleaved turns, as a multiple of spec off's at the same B "
        "(= the tokens per request-step a drafter needs at that K just to break even). K=1of: one request of the "
        "batch drafts one token, the rest none (the price of switching a step to verification)"
        + ("; K=mtp: the MTP head drafts one token a step." if args.head else "."),
    ]
    for p in prompt_lengths:
        context = cost[p, batches[0], 0]["context"]
        lines += [
            "",
            f"Prompts: {'the test prompts' if p == 0 else f'{p} tokens'} (steady steps' context about {context:.0f}).",
            "",
            markdown(
                [[b, f"{cost[p, b, 0]['step_ms']:.2f}", *(f"{cost[p, b, k]['cost_vs_off']:.2f}x" for k in priced)]
                 for b in batches],
                ["batch", "spec off ms/step", *(f"K={k}" for k in priced)],
            ),
        ]  # fmt: skip
        if emitted:
            lines += [
                "",
                "Ceiling on the speed-up over spec off at each batch size, from tokens per request-step measured end "
                "to end (" + ", ".join(f"K={k}: {t:.2f}" for k, t in emitted.items()) + "): tokens per request-step "
                "/ cost.",
                "",
                markdown(
                    [[b, *(f"{t / cost[p, b, k]['cost_vs_off']:.2f}x" for k, t in emitted.items())] for b in batches],
                    ["batch", *(f"K={k}" for k in emitted)],
                ),
            ]
    # every turn's step time per cell, what recipe.bench cost-model fits
    steps = [{**{k: r[k] for k in ("prompt_tokens", "context", "batch", "k")},
              "ms": times[r["prompt_tokens"], r["batch"], r["k"]]} for r in rows]  # fmt: skip
    (out / "verify_cost.json").write_text(json.dumps({"tokens": args.tokens, "steps": steps}, indent=1))
    print("\n".join(lines))  # the tables a results README quotes


if __name__ == "__main__":
    main()
