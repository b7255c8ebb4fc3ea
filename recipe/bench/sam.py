"""SAM drafter micro-benchmarks, side by side in one run, written to ``results/sam/``.

1. Proposer cost per decode step: ``SAMProposer.propose`` vs vLLM's own ``NgramProposer.propose`` and
   Arctic Inference's suffix cache (vLLM's ``suffix`` method's per-step work), at
   context lengths 4k/32k/128k and batch 1/16/64, on the same token rows. Each step appends 1-4 verified
   tokens per row, as vLLM does, and times the whole ``propose`` call.
2. Ingest throughput (tokens/s into an automaton) and memory per token.
3. Teacher-forced acceptance: draft at every position of a response and count how many draft tokens match the
   real continuation, on two corpora of prompts with several responses each (the base model's samples, and
   vLLM source files grouped by the interface they implement): vLLM's n-gram matcher, Arctic suffix decoding as
   vLLM's ``suffix`` method runs it (its global tree holds every earlier response), SAM on its own text, and SAM
   with its group material (the earlier responses to the same prompt) at its defaults and one option changed.

    python -m recipe.bench sam [--quick]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from recipe.dapo.config import spec_group
from recipe.paths import REPO_ROOT
from sam.automaton import SuffixAutomaton
from sam.policy import SAMOptions
from sam.vllm import SAMProposer

K = 4


def agreed(draft: np.ndarray, truth: np.ndarray) -> int:
    """How many leading tokens of ``draft`` the text that followed agrees with (what verification accepts)."""
    ok = 0
    while ok < min(draft.size, truth.size) and draft[ok] == truth[ok]:
        ok += 1
    return ok


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
    warm = SuffixAutomaton()
    warm.extend(tokens[:1000])  # compile
    warm.count_occurrences()
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
    t = time.perf_counter()
    sa.count_occurrences()  # a prompt's history, counted each time it grows
    out["count_tokens_per_s"] = len(sa) / (time.perf_counter() - t)
    out["counted_bytes_per_token"] = sa.bytes_per_token()
    return out


def ngram_draft(text: np.ndarray, n: int, k: int, min_n: int, max_n: int) -> list[int]:
    """vLLM's n-gram matcher (the same numba routine NgramProposer runs) on text[:n]."""
    from vllm.v1.spec_decode.ngram_proposer import _find_longest_matched_ngram_and_propose_tokens

    out = _find_longest_matched_ngram_and_propose_tokens(text[:n], min_n, max_n, n + k + 1, k)
    return list(out)


Group = tuple[np.ndarray, list[np.ndarray]]  # a prompt and its responses


# SAM variants of the teacher-forced table: options over configs/spec/sam.yaml's (sam_group: the defaults), each
# one change from them, so the table shows what each default wins or loses. "one_group" puts every response of
# every prompt in one group (material beyond the prompt's own, as suffix's global tree has)
SAM_VARIANTS = {
    "sam": {"group_sharing": False, "cross_epoch": False},
    "sam_group": {},
    "sam_group/first_occurrence": {"draft_from_counts": False},
    "sam_group/no_chance_cutoff": {"min_token_prob": 0.0},
    "sam_group/min_token_prob_0.2": {"min_token_prob": 0.2},
    "sam_group/min_match_3": {"min_match": 3},
    "sam_group/min_match_1": {"min_match": 1},
    "sam_group/count_prior_0.5": {"count_prior": 0.5},
    "sam_group/count_prior_2": {"count_prior": 2.0},
    "sam_group/no_prior_decay": {"prior_decay": 0.0},
    "sam_group/min_token_prob_0.03": {"min_token_prob": 0.03},
    "sam_group/tokens_per_match_3": {"tokens_per_match": 3.0},
    "sam_group/own_first_occurrence": {"own_latest": False},
    "sam_group/own_first_occurrence/own_bonus_-1": {"own_latest": False, "own_bonus": -1},
    "sam_group/own_bonus_-1": {"own_bonus": -1},
    "sam_group/one_group": {"one_group": True},
}


def teacher_forced(groups: list[Group], modes: list[str]) -> dict:
    """Accepted draft tokens per position (greedy prefix match with the real continuation), drafting at every
    position of every response. A prompt's responses run one after another, each seeing the earlier ones as
    finished siblings; prompts run one after another (suffix's global tree and ``one_group`` see earlier
    prompts' responses). SAM runs through :class:`~sam.policy.BatchDrafter`, the code vLLM's proposer steps."""
    from omegaconf import OmegaConf

    from sam.policy import BatchDrafter

    ngram_cfg = spec_group("ngram")
    sam_cfg = spec_group("sam")
    result = {}
    for mode in modes:
        accepted = drafted = positions = 0
        arctic = ArcticSuffix() if mode == "suffix" else None
        variant = dict(SAM_VARIANTS.get(mode, {}))
        one_group = variant.pop("one_group", False)
        request = 0
        slots = []
        if mode in SAM_VARIANTS:
            opts = {**OmegaConf.to_container(sam_cfg.sam), "batch_threshold": 1 << 20, "cross_epoch": False, **variant}
            drafter = BatchDrafter(SAMOptions.from_dict(opts), K)
            slots = [  # every request starts at once, so no group empties (and is dropped) before the last response
                [drafter.start(prompt, b"all" if one_group else str(g_i).encode()) for _ in responses]
                for g_i, (prompt, responses) in enumerate(groups)
            ]
        for g_i, (prompt, responses) in enumerate(groups):
            for r_i, text in enumerate(responses):
                request += 1
                if arctic is not None:
                    arctic.cache.start_request(request, prompt)
                for pos in range(len(text) - 1):
                    if mode == "ngram":
                        ctx = np.concatenate([prompt, text[: pos + 1]])
                        draft = ngram_draft(ctx, len(ctx), K, ngram_cfg.prompt_lookup_min, ngram_cfg.prompt_lookup_max)
                    elif arctic is not None:
                        draft = arctic.step(request, text[pos : pos + 1], np.concatenate([prompt, text[: pos + 1]]))
                    else:
                        draft = drafter.step(
                            np.array([slots[g_i][r_i]]), text[pos : pos + 1], np.array([0, 1]), np.array([K])
                        )[0]
                    accepted += agreed(np.asarray(draft), text[pos + 1 :])
                    drafted += len(draft)
                    positions += 1
                if arctic is not None:
                    arctic.cache.stop_request(request)  # the response stays in the global tree
                elif slots:
                    drafter.finish(slots[g_i][r_i])
        result[mode] = {
            "accepted_per_position": accepted / positions,
            "draft_acceptance_rate": accepted / max(1, drafted),
            "drafted_per_position": drafted / positions,
        }
    return result


def task_samples(num_prompts: int, n: int) -> list[Group]:
    """Responses the task's base model samples (vLLM, temperature 1, ``n`` per prompt, the DAPO shape) to
    held-out prompts: siblings as the rollouts make them."""
    from omegaconf import OmegaConf

    from mtp.checkpoint import load_tokenizer
    from recipe.dapo.data import load_prompts
    from recipe.dapo.rollout import RolloutEngine
    from recipe.engine import EngineOptions
    from recipe.sft.train import ensure_base_model

    ckpt = ensure_base_model(OmegaConf.load(REPO_ROOT / "configs" / "sft.yaml"))
    _, ids = load_prompts(str(ckpt.parent / "data" / "test.parquet"), load_tokenizer(ckpt), 160)
    engine = RolloutEngine(str(ckpt), None, EngineOptions(max_model_len=1024, seed=0, dtype="float32"))
    try:
        result = engine.generate(ids[:num_prompts], n, {"temperature": 1.0, "top_p": 1.0, "max_tokens": 768})
    finally:
        engine.close()
    groups: list[Group] = [(np.asarray(p, dtype=np.int32), []) for p in ids[:num_prompts]]
    for r in result.responses:
        groups[r.prompt_index][1].append(np.asarray(r.token_ids, dtype=np.int32))
    return groups


SIBLING_FILES = {  # vLLM modules that implement one interface each, file by file (alphabetical, none skipped)
    "mtp_heads": "model_executor/models/*_mtp.py",
    "reasoning_parsers": "reasoning/*_reasoning_parser.py",
    "tool_parsers": "tool_parsers/*_tool_parser.py",
}


def sibling_files(per_group: int, max_bytes: int) -> list[Group]:
    """Byte tokens of vLLM source files grouped by the interface they implement, the first ``per_group`` of
    each in name order, each cut at ``max_bytes``: independent answers to one prompt by different authors
    (often a sibling copied and edited), sharing structure and idiom and differing in detail, as sampled
    responses to one prompt do; nobody here wrote them or chose which are siblings."""
    import vllm

    root = Path(vllm.__file__).parent
    groups = []
    for name, pattern in SIBLING_FILES.items():
        files = sorted(root.glob(pattern))[:per_group]
        prompt = np.frombuffer(f"# {name}\n".encode(), dtype=np.uint8).astype(np.int32)
        texts = [np.frombuffer(f.read_bytes()[:max_bytes], dtype=np.uint8).astype(np.int32) for f in files]
        groups.append((prompt, texts))
    return groups


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

    modes = ["ngram", "suffix", *SAM_VARIANTS]
    acceptance = {
        "embedded_task_samples": teacher_forced(task_samples(8 if args.quick else 24, 8), modes),
        "vllm_sibling_files": teacher_forced(sibling_files(4 if args.quick else 8, 6000), modes),
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
        "Produced by `python -m recipe.bench sam` (one run, side by side).",
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
        f"into automata of {ing['tokens'] // 10} tokens at {ing['tenth_bytes_per_token']:.0f} bytes per token. "
        f"Counting one of those (what a prompt's history does each time it grows, for frequency drafts) runs at "
        f"{ing['count_tokens_per_s'] / 1e6:.1f} M tokens/s and brings it to {ing['counted_bytes_per_token']:.0f} "
        "bytes per token.",
        "",
        "## Teacher-forced acceptance (draft at every position, K=4)",
        "",
        "Corpora: `embedded_task_samples`, the base model's own samples (vLLM, temperature 1, 8 per held-out "
        "prompt); `vllm_sibling_files`, vLLM source files grouped by the interface they implement (MTP heads, "
        "reasoning parsers, tool parsers; 8 each, name order, first 6,000 bytes, byte tokens). A prompt's "
        "responses run one after another, each seeing the earlier ones as finished siblings. `sam_group` is "
        "configs/spec/sam.yaml's SAM; each `sam_group/...` row changes one option (SAM_VARIANTS in the script). "
        "`vs better` is accepted per position over the better of ngram and suffix; `drafts <=` says whether the "
        "row drafts no more per position than that one.",
        "",
        "| corpus | drafter | accepted tokens / position | accepted / drafted | drafted / position | vs better | drafts <= |",
        "|---|---|---|---|---|---|---|",
    ]
    for corpus, modes in acceptance.items():
        better = max((modes[b] for b in ("ngram", "suffix")), key=lambda m: m["accepted_per_position"])
        for mode, m in modes.items():
            rel = m["accepted_per_position"] / better["accepted_per_position"]
            fewer = "yes" if m["drafted_per_position"] <= better["drafted_per_position"] else "no"
            lines.append(
                f"| {corpus} | {mode} | {m['accepted_per_position']:.3f} | {m['draft_acceptance_rate']:.3f} | "
                f"{m['drafted_per_position']:.3f} | {rel:.3f}x | {fewer} |"
            )
    (out / "bench_sam.md").write_text("\n".join(lines) + "\n")
    (out / "step_cost.csv").write_text("\n".join(csv) + "\n")


if __name__ == "__main__":
    main()
