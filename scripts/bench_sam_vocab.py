"""SAM at a real vocabulary: ingest rate and bytes per token of the suffix automaton on a real model's rollouts.

scripts/bench_sam.py measures ingest on the standard library's bytes (an alphabet of 256). A real model's token ids
come from a 49,152-token vocabulary (SmolLM2-135M-Instruct), which changes the automaton's branching: more distinct
edges per state, more of them in the hash table. This samples ``--prompts`` word problems x ``--n`` responses at
temperature 1 with the real model (spec off, cached under artifacts/), then measures, median of ``--repeats``:
- ingest into one automaton of every response (each after its prompt's 3 lead tokens and a unique separator, as a
  prompt's history stores them), and into per-prompt automata (a group corpus each), counted as SAM counts them;
- the same on the standard library's bytes, in the same run, for the ratio.

    .venv/bin/python scripts/bench_sam_vocab.py [--prompts 64 --n 8]   # -> results/sam/vocab.{md,json}
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

LEAD = 3  # configs/spec/sam.yaml lead_tokens


def rollouts(model: str, prompts: int, n: int, max_tokens: int) -> list[tuple[np.ndarray, list[np.ndarray]]]:
    """(prompt ids, responses) per prompt: the real model's samples of the word problems' train split, cached."""
    cache = REPO_ROOT / "artifacts" / f"vocab_rollouts_{model}_{prompts}x{n}_{max_tokens}.npz"
    if not cache.is_file():
        from bench_rollout import mode_engine

        from mtp.checkpoint import load_tokenizer
        from recipe.dapo.data import load_prompts
        from recipe.data.word_problems import write_splits
        from recipe.models import resolve_model

        ckpt = resolve_model(model)
        train, _ = write_splits(REPO_ROOT / "artifacts" / "word_problems")
        _, ids = load_prompts(str(train), load_tokenizer(ckpt), 512, prompts)
        engine = mode_engine(ckpt, "off", 0, None, None, dtype="bfloat16")
        result = engine.generate(ids, n, {"temperature": 1.0, "top_p": 1.0, "max_tokens": max_tokens})
        engine.close()
        flat = {f"p{i}": np.asarray(p, np.int32) for i, p in enumerate(ids)}
        seen: dict[int, int] = {}
        for r in result.responses:
            j = seen[r.prompt_index] = seen.get(r.prompt_index, -1) + 1
            flat[f"r{r.prompt_index}_{j}"] = np.asarray(r.token_ids, np.int32)
        cache.parent.mkdir(parents=True, exist_ok=True)
        np.savez(cache, **flat)
    data = np.load(cache)
    out = []
    for i in range(prompts):
        out.append((data[f"p{i}"], [data[f"r{i}_{j}"] for j in range(n)]))
    return out


def corpus(prompt: np.ndarray, responses: list[np.ndarray], first_separator: int = 1) -> np.ndarray:
    """A prompt's responses as its history automaton holds them: lead, response, unique negative separator."""
    parts = []
    for j, r in enumerate(responses):
        parts += [prompt[-LEAD:], r, np.array([-(first_separator + j)], np.int32)]
    return np.concatenate(parts).astype(np.int32)


def ingest_rate(texts: list[np.ndarray], repeats: int, count: bool) -> tuple[float, float]:
    """Tokens/s building one automaton per text (counted as group corpora are, if ``count``), and bytes per token."""
    from sam import SuffixAutomaton

    total = sum(t.size for t in texts)
    rates, nbytes = [], 0
    for _ in range(repeats):
        start = time.perf_counter()
        nbytes = 0
        for t in texts:
            sa = SuffixAutomaton()
            sa.extend(t)
            if count:
                sa.count_occurrences()
            nbytes += sa.nbytes
        rates.append(total / (time.perf_counter() - start))
    return float(np.median(rates)), nbytes / total


def main() -> None:
    from bench_sam import stdlib_tokens

    from sam import SuffixAutomaton

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=384)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=str(REPO_ROOT / "results" / "sam"))
    args = parser.parse_args()

    groups = rollouts(args.model, args.prompts, args.n, args.max_tokens)
    per_prompt = [corpus(p, rs) for p, rs in groups]
    all_history = np.concatenate([corpus(p, rs, 1 + i * args.n) for i, (p, rs) in enumerate(groups)])
    warm = SuffixAutomaton()
    warm.extend(all_history[:1000])  # compile
    warm.count_occurrences()
    stdlib = stdlib_tokens(int(all_history.size))
    rows = {}
    for name, texts, count in (
        ("real: all responses, one automaton", [all_history], False),
        ("real: one counted automaton per prompt", per_prompt, True),
        ("stdlib bytes: one automaton (same length)", [stdlib], False),
        ("stdlib bytes: same-size pieces, counted", np.array_split(stdlib, len(per_prompt)), True),
    ):
        rate, bpt = ingest_rate(list(texts), args.repeats, count)
        rows[name] = {"tokens_per_s": rate, "bytes_per_token": bpt}
        print(name, round(rate / 1e6, 2), "M tokens/s", round(bpt, 1), "B/token", flush=True)
    distinct = int(np.unique(all_history[all_history >= 0]).size)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        "model": args.model,
        "prompts": args.prompts,
        "n": args.n,
        "tokens": int(all_history.size),
        "distinct_token_ids": distinct,
        "mean_prompt_corpus_tokens": float(np.mean([c.size for c in per_prompt])),
    }
    (out / "vocab.json").write_text(json.dumps({**meta, "rows": rows}, indent=2))
    lines = [
        f"# SAM on a real model's token ids ({args.model})",
        "",
        f"Produced by `.venv/bin/python scripts/bench_sam_vocab.py --prompts {args.prompts} --n {args.n} --max-tokens "
        f"{args.max_tokens} --repeats {args.repeats}`: {meta['tokens']:,} tokens of the model's own responses at "
        f"temperature 1 ({distinct:,} distinct ids of a 49,152-token vocabulary; {meta['mean_prompt_corpus_tokens']:.0f}"
        " tokens per prompt's corpus), stored as SAM's group corpora store them (3 lead tokens, response, separator);"
        " beside them the standard library's bytes, cut to the same length, in the same run. Medians of "
        f"{args.repeats}.",
        "",
        "| corpus | M tokens/s | bytes per token |",
        "|---|---|---|",
        *(f"| {k} | {v['tokens_per_s'] / 1e6:.2f} | {v['bytes_per_token']:.1f} |" for k, v in rows.items()),
    ]
    (out / "vocab.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
