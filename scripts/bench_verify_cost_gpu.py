"""What verifying drafts costs a decode step of SmolLM2-135M's shape on a GPU, by batch size and draft length.

The CPU numbers (results/real/verify_cost.md) price the payoff rule's inputs where the recipe's tests run; this is
the same question on an accelerator, with transformers' own Llama (no vLLM: the lent GPU machine has no vLLM and
cannot install one). B requests hold a KV cache of ``--context`` tokens; a step feeds each request 1 + K tokens
(K drafts) and the cache is cropped back after each timed step. Weights are random in SmolLM2-135M's exact shape
(a step's cost does not depend on their values). Median of ``--repeats`` CUDA-synchronised steps.

    python scripts/bench_verify_cost_gpu.py --out results/real   # on a machine with a CUDA GPU
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

SMOLLM2_135M = dict(  # config.json of the converted checkpoint (recipe/models.py), weights aside
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    rms_norm_eps=1e-5,
    rope_theta=100000.0,
    max_position_embeddings=8192,
    tie_word_embeddings=True,
)


def main() -> None:
    import torch
    from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", default="1,4,8,16,32,64,128,256")
    parser.add_argument("--ks", default="1,2,4,6")
    parser.add_argument("--context", type=int, default=320, help="tokens already in each request's KV cache")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--out", default="results/real")
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    ks = [int(k) for k in args.ks.split(",")]

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SMOLLM2_135M)).to("cuda", torch.bfloat16).eval()
    rows = []
    with torch.no_grad():
        for b in batches:
            cache = DynamicCache()
            ids = torch.randint(0, 49152, (b, args.context), device="cuda")
            model(ids, past_key_values=cache, use_cache=True)
            times = {}
            for q in [1, *[1 + k for k in ks]]:
                step = torch.randint(0, 49152, (b, q), device="cuda")
                samples = []
                for i in range(args.repeats + 3):
                    torch.cuda.synchronize()
                    start = time.perf_counter()
                    model(step, past_key_values=cache, use_cache=True)
                    torch.cuda.synchronize()
                    if i >= 3:
                        samples.append(time.perf_counter() - start)
                    cache.crop(args.context)
                samples.sort()
                times[q] = samples[len(samples) // 2] * 1e3
            for k in ks:
                rows.append(
                    {
                        "batch": b,
                        "k": k,
                        "plain_ms": times[1],
                        "step_ms": times[1 + k],
                        "cost_vs_plain": times[1 + k] / times[1],
                    }
                )
            print(b, {q: round(t, 3) for q, t in times.items()}, flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "verify_cost_gpu.json").write_text(
        json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1)
    )
    cost = {(r["batch"], r["k"]): r for r in rows}
    lines = [
        f"# Verification cost of a decode step on a GPU ({torch.cuda.get_device_name()}), SmolLM2-135M's shape",
        "",
        f"Produced by `python scripts/bench_verify_cost_gpu.py --batches {args.batches} --ks {args.ks} --context "
        f"{args.context} --repeats {args.repeats}` on the lent GPU machine (transformers {__import__('transformers').__version__}, "
        f"torch {torch.__version__}, bf16, eager, random weights in the model's shape). A step of B requests, each "
        f"with {args.context} tokens cached, fed 1 + K tokens; cost as a multiple of the plain step (1 token each).",
        "",
        "| batch | plain ms/step | " + " | ".join(f"K={k}" for k in ks) + " |",
        "|---|---|" + "---|" * len(ks),
    ]
    for b in batches:
        cells = " | ".join(f"{cost[b, k]['cost_vs_plain']:.2f}x" for k in ks)
        lines.append(f"| {b} | {cost[b, ks[0]]['plain_ms']:.2f} | {cells} |")
    (out / "verify_cost_gpu.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
