"""SAM drafter micro-benchmarks, side by side in one run, written to ``results/sam/``.

1. Proposer cost per decode step: ``SAMProposer.propose`` vs vLLM's own ``NgramProposer.propose`` and
   Arctic Inference's suffix cache (vLLM's ``suffix`` method's per-step work), at
   context lengths 4k/32k/128k and batch 1/16/64, on the same token rows. Each step appends 1-4 verified
   tokens per row, as vLLM does, and times the whole ``propose`` call.
2. Ingest throughput (tokens/s into an automaton) and memory per token.
3. Teacher-forced acceptance: draft at every position of a text and count how many draft tokens match the
   real continuation, on the embedded task's reference traces and on the Python standard library's source
   (byte tokens): vLLM's n-gram matcher, Arctic suffix decoding as vLLM's ``suffix`` method runs it (its global
   tree holds every earlier text), SAM on its own text, and SAM with group sharing (every earlier text).

    .venv/bin/python scripts/bench_sam.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from recipe.dapo.config import spec_group  # noqa: E402
from sam import SuffixAutomaton  # noqa: E402
from sam.policy import SAMOptions  # noqa: E402
from sam.vllm import SAMProposer  # noqa: E402

K = 4


def stdlib_tokens(limit: int) -> np.ndarray:
    """Bytes of the Python standard library's source: a real corpus nobody here wrote."""
    import sysconfig

    out, total = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        data = np.frombuffer(path.read_bytes(), dtype=np.uint8).astype(np.int32)
        out.append(data)
        total += data.size
        if total >= limit:
            break
    return np.concatenate(out)[:limit]


def vllm_config(max_len: int, batch: int):
    return SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=K, prompt_lookup_min=2, prompt_lookup_max=5),
        model_config=SimpleNamespace(max_model_len=max_len),
        scheduler_config=SimpleNamespace(max_num_seqs=max(batch, 64)),
        parallel_config=SimpleNamespace(tensor_parallel_size=1),
        additional_config={"sam": {"batch_threshold": 1 << 20, "group_sharing": False, "cross_epoch": False}},
    )


class ArcticSuffix:
    """vLLM's ``suffix`` method's per-step work on Arctic Inference's cache, with configs/spec/suffix.yaml's
    options: append a request's newly sampled tokens, then draft from the end of its context."""

    def __init__(self):
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        opts = spec_group("suffix")
        self.depth = int(opts.suffix_decoding_max_tree_depth)
        self.spec_factor = float(opts.suffix_decoding_max_spec_factor)
        self.min_token_prob = float(opts.suffix_decoding_min_token_prob)
        self.cache = SuffixDecodingCache(self.depth, int(opts.suffix_decoding_max_cached_requests))

    def step(self, request: int, sampled, context: np.ndarray) -> list[int]:
        """``context``: the request's prompt and response so far, ``sampled`` included."""
        self.cache.add_active_response(request, np.asarray(sampled, dtype=np.int32))
        draft = self.cache.speculate(
            request, np.ascontiguousarray(context[-self.depth :]), max_spec_tokens=K,
            max_spec_factor=self.spec_factor, min_token_prob=self.min_token_prob,
        )  # fmt: skip
        return list(draft.token_ids)


def step_cost(context: int, batch: int, steps: int, rng: np.random.Generator) -> dict:
    """Median ms per propose() call for SAM, vLLM ngram (and Arctic suffix) on identical rows."""
    from vllm.v1.spec_decode.ngram_proposer import NgramProposer

    max_len = context + 4 * steps + 16
    corpus = stdlib_tokens(context + 4 * steps + 4096)
    rows = np.zeros((max(batch, 64), max_len), dtype=np.int32)
    lengths = np.zeros(max(batch, 64), dtype=np.int32)
    for i in range(batch):
        off = int(rng.integers(0, 4096))
        rows[i, : context + 4 * steps] = corpus[off : off + context + 4 * steps]
        lengths[i] = context
    cfg = vllm_config(max_len, batch)
    sam = SAMProposer(cfg)
    ids = [f"req-{i}" for i in range(batch)]  # what vLLM's model runner tells SAM about each row
    sam.attach_runner(SimpleNamespace(input_batch=SimpleNamespace(req_ids=ids), requests=dict.fromkeys(ids)))
    ngram = NgramProposer(cfg)
    # warm SAM's automata with each row's context (what a request's prefill + earlier steps did)
    t0 = time.perf_counter()
    sam.propose([[int(rows[i, context - 1])] for i in range(batch)], lengths, rows)
    warm_s = time.perf_counter() - t0
    contenders = {"sam": lambda s, n, r: sam.propose(s, n, r), "vllm_ngram": lambda s, n, r: ngram.propose(K, s, n, r)}
    arctic = ArcticSuffix()
    for i in range(batch):
        arctic.cache.start_request(i, rows[i, : context - 1].copy())
        arctic.step(i, rows[i, context - 1 : context], rows[i, :context])
    contenders["arctic_suffix"] = lambda s, n, r: [arctic.step(i, s[i], r[i, : n[i]]) for i in range(len(s))]
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(steps):
        sampled = []
        for i in range(batch):
            take = int(rng.integers(1, 5))
            sampled.append(rows[i, lengths[i] : lengths[i] + take].tolist())
            lengths[i] += take
        for name, fn in contenders.items():
            t = time.perf_counter()
            fn(sampled, lengths, rows)
            times[name].append(time.perf_counter() - t)
    out = {f"{name}_ms": 1000 * float(np.median(v)) for name, v in times.items()}
    out.update(context=context, batch=batch, sam_warm_ingest_s=warm_s)
    out["ngram_over_sam"] = out["vllm_ngram_ms"] / out["sam_ms"]
    return out


def ingest(tokens: np.ndarray, repeats: int = 5) -> dict:
    """Tokens/s into one automaton grown from the default capacity (median of ``repeats``) and its bytes per
    token, for the whole of ``tokens`` and for automata of a tenth of it (a prompt's history, say)."""
    SuffixAutomaton().extend(tokens[:1000])  # compile
    out = {"tokens": int(tokens.size)}
    for name, size in (("", tokens.size), ("tenth_", tokens.size // 10)):
        rates = []
        for _ in range(repeats):
            t = time.perf_counter()
            for start in range(0, tokens.size, size):
                sa = SuffixAutomaton()
                sa.extend(tokens[start : start + size])
            rates.append(tokens.size / (time.perf_counter() - t))
        out[f"{name}tokens_per_s"] = float(np.median(rates))
        out[f"{name}bytes_per_token"] = sa.bytes_per_token()
    return out


def ngram_draft(text: np.ndarray, n: int, k: int, min_n: int = 2, max_n: int = 5) -> list[int]:
    """vLLM's n-gram matcher (the same numba routine NgramProposer runs) on text[:n]."""
    from vllm.v1.spec_decode.ngram_proposer import _find_longest_matched_ngram_and_propose_tokens

    out = _find_longest_matched_ngram_and_propose_tokens(text[:n], min_n, max_n, n + k + 1, k)
    return list(out)


def teacher_forced(texts: list[np.ndarray], prefixes: list[np.ndarray] | None = None) -> dict:
    """Accepted draft tokens per position (greedy prefix match with the real continuation)."""
    opts = SAMOptions(min_match=2)
    result = {}
    for mode in ("ngram", "suffix", "sam", "sam_group"):
        accepted = drafted = positions = 0
        group = SuffixAutomaton()
        arctic = ArcticSuffix()
        for t_i, text in enumerate(texts):
            sa = SuffixAutomaton()
            matcher = group.matcher() if mode == "sam_group" else None
            prefix = prefixes[t_i] if prefixes is not None else text[:0]
            if mode == "suffix":
                arctic.cache.start_request(t_i, prefix)
            sa.extend(prefix)
            for pos in range(len(text) - 1):
                sa.extend(text[pos : pos + 1])
                if matcher is not None:
                    matcher.feed(text[pos : pos + 1])
                if mode == "ngram":
                    ctx = np.concatenate([prefix, text[: pos + 1]])
                    draft = ngram_draft(ctx, len(ctx), K)
                elif mode == "suffix":
                    draft = arctic.step(t_i, text[pos : pos + 1], np.concatenate([prefix, text[: pos + 1]]))
                else:
                    src = sa
                    if matcher is not None and matcher.match_length > sa.match_length:
                        src = matcher
                    draft = src.draft(opts.draft_length(src.match_length, K), opts.min_match)
                truth = text[pos + 1 : pos + 1 + len(draft)].tolist()
                ok = 0
                while ok < len(draft) and ok < len(truth) and draft[ok] == truth[ok]:
                    ok += 1
                accepted += ok
                drafted += len(draft)
                positions += 1
            group.extend(text)
            group.extend([-(t_i + 1)])
            if mode == "suffix":
                arctic.cache.stop_request(t_i)  # the response stays in the global tree
        result[mode] = {
            "accepted_per_position": accepted / positions,
            "draft_acceptance_rate": accepted / max(1, drafted),
            "drafted_per_position": drafted / positions,
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (smoke run)")
    parser.add_argument("--out", default=str(REPO_ROOT / "results" / "sam"))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    contexts = [4096, 32768] if args.quick else [4096, 32768, 131072]
    batches = [1, 16] if args.quick else [1, 16, 64]
    steps = 10 if args.quick else 30

    cost = []
    for context in contexts:
        for batch in batches:
            row = step_cost(context, batch, steps, rng)
            cost.append(row)
            print(json.dumps(row))
    ing = ingest(stdlib_tokens(200_000 if args.quick else 1_000_000), repeats=2 if args.quick else 5)
    print(json.dumps(ing))

    from recipe.data.task import generate_rows
    from recipe.data.tokenizer import train_tokenizer

    rows = generate_rows(400, seed=123, split="train")
    tok = train_tokenizer([r["extra_info"]["solution"] for r in rows] + [r["prompt"][0]["content"] for r in rows], 320)
    by_prompt = [r for r in rows if len(r["extra_info"]["solution"]) > 200][: 20 if args.quick else 60]
    traces = [
        np.asarray(tok(r["extra_info"]["solution"], add_special_tokens=False)["input_ids"], dtype=np.int32)
        for r in by_prompt
    ]
    prompts = [
        np.asarray(tok(r["prompt"][0]["content"], add_special_tokens=False)["input_ids"], dtype=np.int32)
        for r in by_prompt
    ]
    corpus = stdlib_tokens(60_000 if args.quick else 200_000)
    chunks = [corpus[i : i + 4000] for i in range(0, corpus.size, 4000)]
    acceptance = {
        "embedded_task_traces": teacher_forced(traces, prompts),
        "python_stdlib_bytes": teacher_forced(chunks),
    }
    print(json.dumps(acceptance, indent=1))
    (out / "bench_sam.json").write_text(
        json.dumps({"step_cost": cost, "ingest": ing, "teacher_forced": acceptance}, indent=2)
    )
    write_tables(out, cost, ing, acceptance)


def write_tables(out: Path, cost: list[dict], ing: dict, acceptance: dict) -> None:
    have_arctic = "arctic_suffix_ms" in cost[0]
    head = (
        "| context | batch | SAM ms/step | vLLM ngram ms/step |"
        + (" Arctic suffix ms/step |" if have_arctic else "")
        + " ngram / SAM |"
    )
    lines = [
        "# SAM drafter benchmarks",
        "",
        "Produced by `.venv/bin/python scripts/bench_sam.py` (one run, side by side).",
        "",
        "## Proposer cost per decode step (median)",
        "",
        head,
        "|" + "---|" * (head.count("|") - 1),
    ]
    csv = ["context,batch,sam_ms,vllm_ngram_ms,arctic_suffix_ms,ngram_over_sam"]
    for r in cost:
        arctic = f" {r['arctic_suffix_ms']:.3f} |" if have_arctic else ""
        lines.append(
            f"| {r['context']} | {r['batch']} | {r['sam_ms']:.3f} | {r['vllm_ngram_ms']:.3f} |{arctic} {r['ngram_over_sam']:.1f}x |"
        )
        csv.append(
            f"{r['context']},{r['batch']},{r['sam_ms']:.4f},{r['vllm_ngram_ms']:.4f},{r.get('arctic_suffix_ms', '')},{r['ngram_over_sam']:.2f}"
        )
    lines += [
        "",
        f"Ingest (median of repeats, each automaton grown from the default capacity): "
        f"{ing['tokens_per_s'] / 1e6:.2f} M tokens/s into one automaton of {ing['tokens']} tokens at "
        f"{ing['bytes_per_token']:.0f} bytes per token of text; {ing['tenth_tokens_per_s'] / 1e6:.2f} M tokens/s "
        f"into automata of {ing['tokens'] // 10} tokens at {ing['tenth_bytes_per_token']:.0f} bytes per token.",
        "",
        "## Teacher-forced acceptance (draft at every position, K=4)",
        "",
        "| corpus | drafter | accepted tokens / position | accepted / drafted | drafted / position |",
        "|---|---|---|---|---|",
    ]
    for corpus, modes in acceptance.items():
        for mode, m in modes.items():
            lines.append(
                f"| {corpus} | {mode} | {m['accepted_per_position']:.3f} | {m['draft_acceptance_rate']:.3f} | {m['drafted_per_position']:.3f} |"
            )
    (out / "README.md").write_text("\n".join(lines) + "\n")
    (out / "step_cost.csv").write_text("\n".join(csv) + "\n")


if __name__ == "__main__":
    main()
