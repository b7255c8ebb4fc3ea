"""vLLM CPU sampling speed of a real model in bfloat16 against float32, side by side -> ``results/real/dtype/``.

    python -m recipe.bench dtype [--model smollm2-135m-instruct --prompts 32 --tokens 96 --repeats 3]

Every dtype samples the same prompts (T=1, a fixed length: ``ignore_eos``) after a warm-up, taking turns per repeat;
the table has medians. On x86 CPUs without AVX512-BF16 or AMX, vLLM emulates bfloat16 matmuls
(``recipe.engine.slow_bfloat16_cpu``).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from pathlib import Path

from recipe.paths import REPO_ROOT

DTYPES = ("bfloat16", "float32")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(REPO_ROOT / "results" / "real" / "dtype"))
    args = parser.parse_args()

    from vllm import SamplingParams

    from recipe.data.loader import load_problems
    from recipe.data.word_problems import write_splits
    from recipe.engine import EngineOptions, make_llm, slow_bfloat16_cpu
    from recipe.models import resolve_model

    model = str(resolve_model(args.model))
    prompts = [p.messages[0]["content"] for p in load_problems(write_splits()[1], max_rows=args.prompts)]
    params = SamplingParams(temperature=1.0, max_tokens=args.tokens, ignore_eos=True, seed=0)
    engines = {d: make_llm(model, options=EngineOptions(max_model_len=1024, seed=0, dtype=d)) for d in DTYPES}
    for llm in engines.values():
        llm.generate(prompts[:4], params, use_tqdm=False)
    rates: dict[str, list[float]] = {d: [] for d in DTYPES}
    for rep in range(args.repeats):
        for dtype in DTYPES if rep % 2 == 0 else DTYPES[::-1]:
            start = time.perf_counter()
            out = engines[dtype].generate(prompts, params, use_tqdm=False)
            tokens = sum(len(o.outputs[0].token_ids) for o in out)
            rates[dtype].append(tokens / (time.perf_counter() - start))
            print(f"{dtype} repeat {rep}: {rates[dtype][-1]:.0f} tokens/s", flush=True)
    bf16, fp32 = (statistics.median(rates[d]) for d in DTYPES)
    lines = [
        f"# {args.model}: vLLM CPU sampling in bfloat16 vs float32",
        "",
        f"Produced by `python -m recipe.bench dtype --model {args.model} --prompts {args.prompts} --tokens "
        f"{args.tokens} --repeats {args.repeats}` on {platform.processor() or platform.machine()} "
        f"(`slow_bfloat16_cpu()`: {slow_bfloat16_cpu()}): {args.prompts} held-out word problems sampled together, "
        f"{args.tokens} tokens each at T=1, both engines in one process taking turns; medians of {args.repeats}.",
        "",
        "| dtype | tokens/s | repeats |",
        "|---|---|---|",
        *(f"| {d} | {statistics.median(rates[d]):.0f} | {', '.join(f'{r:.0f}' for r in rates[d])} |" for d in DTYPES),
        "",
        f"float32 / bfloat16: {fp32 / bf16:.2f}x.",
    ]
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "dtype.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
