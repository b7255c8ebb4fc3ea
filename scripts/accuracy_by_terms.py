"""The base model's accuracy by number of terms on the first problems of the SFT train split and of the test
split, sampled as in rollouts and greedy: is the model memorising its training problems, or are they easier?
Writes ``results/demo/accuracy_by_terms.md``.

    .venv/bin/python scripts/accuracy_by_terms.py [--problems 256] [--n 8]
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))


def main() -> None:
    from omegaconf import OmegaConf

    from recipe.dapo.data import num_terms
    from recipe.data.loader import load_problems
    from recipe.engine import EngineOptions, make_llm
    from recipe.evaluate import evaluate
    from recipe.sft.train import ensure_base_model

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--problems", type=int, default=256, help="first problems of each split")
    parser.add_argument("--n", type=int, default=8, help="samples per problem at temperature 1")
    parser.add_argument("--out", default=str(REPO_ROOT / "results" / "demo" / "accuracy_by_terms.md"))
    args = parser.parse_args()

    ckpt = ensure_base_model(OmegaConf.load(REPO_ROOT / "configs" / "sft.yaml"))
    llm = make_llm(str(ckpt), None, EngineOptions(max_model_len=2048))
    table: dict[tuple[str, str], dict[int, list[bool]]] = {}
    for split in ("train", "test"):
        problems = load_problems(ckpt.parent / "data" / f"{split}.parquet", max_rows=args.problems)
        for name, n, temperature in (("sampled", args.n, 1.0), ("greedy", 1, 0.0)):
            result = evaluate(llm, problems, n=n, temperature=temperature, max_tokens=1024)
            by_terms: dict[int, list[bool]] = defaultdict(list)
            for i, sample in enumerate(result.samples):
                by_terms[num_terms(problems[i // n].solution)].append(sample["acc"])
            table[(split, name)] = by_terms
    terms = sorted({t for by_terms in table.values() for t in by_terms})
    lines = [
        f"# Base model accuracy by number of terms ({args.problems} first problems per split; sampled: {args.n} "
        "samples at temperature 1; greedy: one)",
        "",
        f"Produced by `.venv/bin/python scripts/accuracy_by_terms.py --problems {args.problems} --n {args.n}`.",
        "",
        "| terms | train problems | train sampled | train greedy | test problems | test sampled | test greedy |",
        "|---|---|---|---|---|---|---|",
    ]

    def cell(split: str, name: str, t: int) -> str:
        acc = table[(split, name)].get(t)
        return f"{sum(acc) / len(acc):.3f}" if acc else ""

    for t in terms:
        counts = [len(table[(split, "greedy")].get(t, [])) for split in ("train", "test")]
        lines.append(
            f"| {t} | {counts[0]} | {cell('train', 'sampled', t)} | {cell('train', 'greedy', t)} | {counts[1]} | "
            f"{cell('test', 'sampled', t)} | {cell('test', 'greedy', t)} |"
        )
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
