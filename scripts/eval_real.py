"""Held-out accuracy of a real model on the word problems (greedy and mean@k at temperature 1): where DAPO starts.

Scored by the training reward's scorer (recipe/dapo/batch.py: the last number of the response for
``word_problems``), on the test split of recipe/data/word_problems.py, with vLLM (spec off).

    .venv/bin/python scripts/eval_real.py [--model smollm2-135m-instruct --k 8]   # -> results/real/base_accuracy.md
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))


def main() -> None:
    from recipe.data.loader import load_problems
    from recipe.data.word_problems import write_splits
    from recipe.engine import EngineOptions, make_llm
    from recipe.evaluate import evaluate
    from recipe.models import resolve_model

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--k", type=int, default=8, help="samples per problem for mean@k")
    parser.add_argument("--problems", type=int, default=300, help="test problems (greedy); mean@k on the first third")
    parser.add_argument("--max-tokens", type=int, default=384)
    parser.add_argument("--out", default=str(REPO_ROOT / "results" / "real"))
    args = parser.parse_args()

    ckpt = resolve_model(args.model)
    _, test_path = write_splits()
    test = load_problems(test_path)[: args.problems]
    llm = make_llm(str(ckpt), None, EngineOptions(max_model_len=1024, gpu_memory_utilization=0.15))
    greedy = evaluate(llm, test, n=1, temperature=0.0, max_tokens=args.max_tokens)
    sampled = evaluate(llm, test[: len(test) // 3], n=args.k, temperature=1.0, max_tokens=args.max_tokens)
    llm.llm_engine.engine_core.shutdown()

    any_correct = np.array([s["acc"] for s in sampled.samples]).reshape(-1, args.k).any(axis=1)
    metrics = {
        "model": args.model,
        "greedy": {"problems": len(test), "acc": greedy.pass_at_1, "mean_tokens": greedy.mean_response_tokens},
        f"mean@{args.k}": {
            "problems": len(test) // 3,
            "acc": sampled.pass_at_1,
            "pass@k": float(any_correct.mean()),
            "mean_tokens": sampled.mean_response_tokens,
            "at_max_tokens": float(np.mean(np.array(sampled.response_lengths) >= args.max_tokens)),
        },
        "formatted_answer_share": float(np.mean([s["pred"] != "[INVALID]" for s in sampled.samples])),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "base_accuracy.json").write_text(json.dumps(metrics, indent=2))
    m = metrics[f"mean@{args.k}"]
    lines = [
        f"# {args.model} on the held-out word problems, before RL",
        "",
        f"Produced by `.venv/bin/python scripts/eval_real.py --model {args.model} --k {args.k} --problems "
        f"{args.problems} --max-tokens {args.max_tokens}` (vLLM CPU, bf16, spec off).",
        "",
        "| measure | problems | accuracy | mean response tokens |",
        "|---|---|---|---|",
        f"| greedy | {len(test)} | {greedy.pass_at_1:.3f} | {greedy.mean_response_tokens:.0f} |",
        f"| mean@{args.k} (T=1) | {m['problems']} | {m['acc']:.3f} | {m['mean_tokens']:.0f} |",
        f"| pass@{args.k} (T=1) | {m['problems']} | {m['pass@k']:.3f} | - |",
        "",
        f"{m['at_max_tokens']:.0%} of the sampled responses ran to the {args.max_tokens}-token budget; the long tail of "
        "a rollout is these.",
    ]
    (out / "base_accuracy.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
