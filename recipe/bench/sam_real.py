"""SAM on a real model's rollouts: the automaton's ingest rate and bytes per token at a real vocabulary, and SAM
against vLLM's suffix decoding teacher-forced, each drafter's threshold swept.

recipe/bench/sam.py measures ingest on the standard library's bytes (an alphabet of 256). A real model's token ids
come from a 49,152-token vocabulary (SmolLM2-135M-Instruct), which changes the automaton's branching: more distinct
edges per state, more of them in the hash table. This samples ``--prompts`` word problems x ``--n`` responses at
temperature 1 with the real model (spec off, cached under artifacts/), then measures, median of ``--repeats``:
- ingest into one automaton of every response (each after its prompt's 3 lead tokens and a unique separator, as a
  prompt's history stores them), and into per-prompt automata (a group corpus each), counted as SAM counts them,
  every automaton in one pool as the drafter keeps them; and each prompt's responses stored through the drafter's
  own history corpus (``sam.policy.ResponseCorpus.add``), which is what a finished rollout costs SAM;
- the same on the standard library's bytes, in the same run, for the ratio;
- teacher-forced drafting over the same responses, grouped by prompt (a prompt's responses one after another, each
  seeing the earlier ones as finished siblings, and SAM's and suffix's corpora of every prompt's responses every
  earlier one): accepted and drafted tokens per position at K = configs/spec/sam.yaml's, SAM at the payoff rule's
  cut for a threshold (each row's source picked by what its draft gains at that cost under the learned chances of
  sam/payoff.py's AcceptanceModel, fed every position's outcome; the tokens sent whose chance exceeds it), suffix at
  its ``min_token_prob``; both swept, so the two curves compare at equal drafting;
- the compiled drafter's step at 64 rows on the same responses.

    python -m recipe.bench sam-real [--prompts 64 --n 8]   # -> results/real/teacher_forced/
    python -m recipe.bench sam-real --split test           # prompts the drafter was never tuned on
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import yaml

from recipe.bench.sam import agreed, stdlib_tokens
from recipe.paths import REPO_ROOT

LEAD = 3  # configs/spec/sam.yaml lead_tokens


def rollouts(
    model: str, prompts: int, n: int, max_tokens: int, split: str = "train"
) -> list[tuple[np.ndarray, list[np.ndarray]]]:
    """(prompt ids, responses) per prompt: the real model's samples of the word problems' ``split``, cached."""
    tag = "" if split == "train" else f"_{split}"
    cache = REPO_ROOT / "artifacts" / f"vocab_rollouts_{model}_{prompts}x{n}_{max_tokens}{tag}.npz"
    if not cache.is_file():
        from mtp.checkpoint import load_tokenizer
        from recipe.bench.rollout import mode_engine
        from recipe.dapo.data import load_prompts
        from recipe.data.word_problems import write_splits
        from recipe.models import resolve_model

        ckpt = resolve_model(model)
        train, test = write_splits()
        _, ids = load_prompts(str(train if split == "train" else test), load_tokenizer(ckpt), 512, prompts)
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
    """Tokens/s building one automaton per text, all in one pool as the drafter keeps them (counted as group corpora
    are, if ``count``), and bytes per token."""
    from sam.automaton import AutomatonPool, SuffixAutomaton

    pool = AutomatonPool()
    total = sum(t.size for t in texts)
    rates, nbytes = [], 0
    for _ in range(repeats):
        automata = []
        start = time.perf_counter()
        for t in texts:
            sa = SuffixAutomaton(pool=pool)
            sa.extend(t)
            if count:
                sa.count_occurrences()
            automata.append(sa)
        rates.append(total / (time.perf_counter() - start))
        nbytes = sum(sa.nbytes for sa in automata)
        for sa in automata:
            pool.release(sa.slot)
    return float(np.median(rates)), nbytes / total


def history_ingest_rate(groups: list[tuple[np.ndarray, list[np.ndarray]]], repeats: int) -> tuple[float, float]:
    """Tokens/s storing each prompt's responses as its history corpus stores a finished rollout
    (sam.policy.ResponseCorpus.add: lead, response, separator each, counted), all in one pool, and bytes per token."""
    from sam.automaton import AutomatonPool
    from sam.policy import ResponseCorpus

    pool = AutomatonPool()
    rates, nbytes, total = [], 0, 0
    for _ in range(repeats):
        corpora = [ResponseCorpus(pool, prompt[-LEAD:], counted=True) for prompt, _ in groups]
        start = time.perf_counter()
        for corpus_, (_, responses) in zip(corpora, groups, strict=True):
            corpus_.add(responses)
        seconds = time.perf_counter() - start
        total = sum(c.num_tokens for c in corpora)
        rates.append(total / seconds)
        nbytes = sum(c.nbytes for c in corpora)
        for corpus_ in corpora:
            corpus_.close()
    return float(np.median(rates)), nbytes / total


SAM_THRESHOLDS = (0.0, 0.01, 0.02, 0.03, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
SUFFIX_MIN_TOKEN_PROBS = (0.0, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9)


def sam_pass(groups: list[tuple[np.ndarray, list[np.ndarray]]], threshold: float, options: dict) -> dict:
    """SAM teacher-forced over ``groups`` with the payoff rule's cut at ``threshold``: each row drafts from the source
    whose draft gains the most at that cost per draft token and sends the tokens whose learned chance exceeds it
    (sam/payoff.py's AcceptanceModel, fed every position's outcome). ``options`` override configs/spec/sam.yaml's."""
    from omegaconf import OmegaConf

    from recipe.dapo.config import spec_group
    from sam.payoff import AcceptanceModel
    from sam.policy import BatchDrafter, SAMOptions

    sam_cfg = spec_group("sam")
    k = int(sam_cfg.num_speculative_tokens)
    opts = {
        **OmegaConf.to_container(sam_cfg.sam), "batch_threshold": 1 << 20, "cross_epoch": False, "payoff": False,
        **options,
    }  # fmt: skip
    drafter = BatchDrafter(SAMOptions.from_dict(opts), k)
    model = AcceptanceModel(k, levels=drafter.options.scored)
    accepted = drafted = positions = 0
    slots = [[drafter.start(p, str(g).encode()) for _ in rs] for g, (p, rs) in enumerate(groups)]
    for g, (_, responses) in enumerate(groups):
        for r, text in enumerate(responses):
            slot = np.array([slots[g][r]])
            for pos in range(len(text) - 1):
                buf, n, group, mlen, level = drafter.step_arrays(
                    slot, text[pos : pos + 1], np.array([0, 1]), np.array([k]),
                    model.conditional() if drafter.options.scored else None, threshold, slot + pos,
                )  # fmt: skip
                n = int(n[0])
                positions += 1
                if n == 0:
                    continue
                ok = agreed(buf[0, :n], text[pos + 1 :])
                band = model.band(mlen[:1])
                keep = int((model.chances(group[:1].astype(np.int64), band, level[:1])[0, :n] > threshold).sum())
                drafted += keep
                accepted += min(keep, ok)
                if drafter.options.scored:  # the payoff rule learns from the explored candidate, as the proposer
                    buf, n, group, mlen, level = drafter.explored(1)
                    n, band = int(n[0]), model.band(mlen)
                    ok = agreed(buf[0, :n], text[pos + 1 :])
                model.observe(group.astype(np.int64), band, level, np.array([n]), np.array([ok]))
            drafter.finish(slots[g][r])
    return {
        "drafter": "sam",
        "threshold": float(threshold),
        "drafted_per_position": drafted / positions,
        "accepted_per_position": accepted / positions,
        "acceptance": accepted / max(drafted, 1),
    }


def step_cost(groups: list[tuple[np.ndarray, list[np.ndarray]]], prompts: int = 8, repeats: int = 3) -> dict:
    """Milliseconds per compiled drafter step (:meth:`sam.policy.BatchDrafter.step_arrays`, the proposer's hot path)
    over ``prompts`` prompts' responses at once (8 x 8: 64 rows, one token per row per step, as a step without
    drafts feeds them), after a first epoch of the same prompts has filled the histories and the corpus of every
    prompt's responses; the steps with at least 32 rows, median and mean over ``repeats`` epochs (a mean includes
    the recounts of group material as responses finish). Scored, with every prompt's responses (``scored``,
    ``global_sharing``: configs/spec/sam.yaml's default; a fresh model's chances, at a cost of 0.3 per draft token),
    and by the longest match (``scored`` and ``global_sharing`` off)."""
    from omegaconf import OmegaConf

    from recipe.dapo.config import spec_group
    from sam.payoff import AcceptanceModel
    from sam.policy import BatchDrafter, SAMOptions

    sam_cfg = spec_group("sam")
    k = int(sam_cfg.num_speculative_tokens)
    defaults = OmegaConf.to_container(sam_cfg.sam)
    chosen = groups[:prompts]
    texts = [r for _, rs in chosen for r in rs]
    out = {}
    for name, over in (
        ("scored", {"scored": True, "global_sharing": True}),
        ("longest_match", {"scored": False, "global_sharing": False}),
    ):
        options = SAMOptions.from_dict({**defaults, **over})
        table = AcceptanceModel(k).conditional() if options.scored else None
        drafter = BatchDrafter(options, k)
        times: list[float] = []
        for epoch in range(repeats + 1):
            slots = np.array([drafter.start(p, str(g).encode()) for g, (p, rs) in enumerate(chosen) for _ in rs])
            pos = np.zeros(len(texts), dtype=np.int64)
            live = np.ones(len(texts), dtype=bool)
            while live.any():
                rows = np.flatnonzero(live)
                tokens = np.array([texts[r][pos[r]] for r in rows], dtype=np.int32)
                start = time.perf_counter()
                drafter.step_arrays(slots[rows], tokens, np.arange(rows.size + 1), np.full(rows.size, k), table, 0.3)
                if epoch > 0 and rows.size >= 32:
                    times.append(time.perf_counter() - start)
                pos[rows] += 1
                for r in rows[pos[rows] >= np.array([texts[r].size for r in rows])]:
                    live[r] = False
                    drafter.finish(slots[r])
        out[name] = {"median_ms": 1000 * float(np.median(times)), "mean_ms": 1000 * float(np.mean(times))}
    return out


def sam_option_values(items: list[str]) -> dict:
    """``--sam-option KEY=VALUE`` flags as a dict of SAM options (values read as YAML: true, 0.1, [1, 2])."""
    options = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--sam-option {item!r}: expected KEY=VALUE")
        options[key] = yaml.safe_load(value)
    return options


def teacher_forced_sweep(groups: list[tuple[np.ndarray, list[np.ndarray]]], sam_options: dict) -> dict:
    """Accepted and drafted tokens per position for SAM at each of SAM_THRESHOLDS (a pass each: with ``scored``, the
    threshold also picks each row's source) and suffix at each of SUFFIX_MIN_TOKEN_PROBS."""
    from arctic_inference.suffix_decoding import SuffixDecodingCache
    from omegaconf import OmegaConf

    from recipe.dapo.config import spec_group
    from sam.policy import SAMOptions

    k = int(spec_group("sam").num_speculative_tokens)
    rows = [sam_pass(groups, t, sam_options) for t in SAM_THRESHOLDS]
    suffix_cfg = spec_group("suffix")
    depth = int(suffix_cfg.suffix_decoding_max_tree_depth)
    for min_prob in SUFFIX_MIN_TOKEN_PROBS:
        cache = SuffixDecodingCache(depth, int(suffix_cfg.suffix_decoding_max_cached_requests))
        acc = dft = pos_count = 0
        request = 0
        for prompt, responses in groups:
            for text in responses:
                request += 1
                cache.start_request(request, prompt)
                for pos in range(len(text) - 1):
                    cache.add_active_response(request, text[pos : pos + 1])
                    context = np.concatenate([prompt, text[: pos + 1]])
                    draft = cache.speculate(
                        request, np.ascontiguousarray(context[-depth:]), max_spec_tokens=k,
                        max_spec_factor=float(suffix_cfg.suffix_decoding_max_spec_factor), min_token_prob=min_prob,
                    ).token_ids  # fmt: skip
                    acc += agreed(np.asarray(draft), text[pos + 1 :])
                    dft += len(draft)
                    pos_count += 1
                cache.stop_request(request)
        rows.append(
            {
                "drafter": "suffix",
                "threshold": min_prob,
                "drafted_per_position": dft / pos_count,
                "accepted_per_position": acc / pos_count,
                "acceptance": acc / max(dft, 1),
            }
        )
    sam = sorted((r for r in rows if r["drafter"] == "sam"), key=lambda r: r["drafted_per_position"])
    xs = [r["drafted_per_position"] for r in sam]
    ys = [r["accepted_per_position"] for r in sam]
    for row in rows:
        if row["drafter"] == "suffix" and xs[0] <= row["drafted_per_position"] <= xs[-1]:
            row["sam_at_equal_drafting"] = float(np.interp(row["drafted_per_position"], xs, ys))
    scored = SAMOptions.from_dict({**OmegaConf.to_container(spec_group("sam").sam), **sam_options}).scored
    return {"k": k, "scored": scored, "rows": rows}


def main() -> None:
    from sam.automaton import SuffixAutomaton

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=384)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=str(REPO_ROOT / "results" / "real" / "teacher_forced"))
    parser.add_argument(
        "--split", default="train", choices=("train", "test"),
        help="the word problems' split the prompts come from (test: prompts the drafter was never tuned on; its "
        "files are named *_test)",
    )  # fmt: skip
    parser.add_argument(
        "--sam-option", action="append", default=[], metavar="KEY=VALUE",
        help="a SAM option over configs/spec/sam.yaml's for the teacher-forced sweep (files named *_KEYVALUE)",
    )  # fmt: skip
    parser.add_argument(
        "--ingest-only", action="store_true",
        help="measure ingest only (sam_ingest*.md and the ingest of sam_real*.json), not the teacher-forced sweep",
    )  # fmt: skip
    args = parser.parse_args()

    sam_options = sam_option_values(args.sam_option)
    groups = rollouts(args.model, args.prompts, args.n, args.max_tokens, args.split)
    tag = ("" if args.split == "train" else f"_{args.split}") + "".join(f"_{k}{v}" for k, v in sam_options.items())
    per_prompt = [corpus(p, rs) for p, rs in groups]
    all_history = np.concatenate([corpus(p, rs, 1 + i * args.n) for i, (p, rs) in enumerate(groups)])
    warm = SuffixAutomaton()
    warm.extend(all_history[:1000])  # compile
    warm.count_occurrences()
    stdlib = stdlib_tokens(int(all_history.size))
    rows = {}
    measures = {  # row -> (tokens/s, bytes per token)
        "real: all responses, one automaton": lambda: ingest_rate([all_history], args.repeats, False),
        "real: one counted automaton per prompt": lambda: ingest_rate(per_prompt, args.repeats, True),
        "real: each prompt's rollout into its history corpus (ResponseCorpus.add)": (
            lambda: history_ingest_rate(groups, args.repeats)
        ),
        "stdlib bytes: one automaton (same length)": lambda: ingest_rate([stdlib], args.repeats, False),
        "stdlib bytes: same-size pieces, counted": (
            lambda: ingest_rate(list(np.array_split(stdlib, len(per_prompt))), args.repeats, True)
        ),
    }
    for name, measure in measures.items():
        rate, bpt = measure()
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
    options_flags = "".join(f" --sam-option {k}={v}" for k, v in sam_options.items())
    over = f" with {sam_options}" if sam_options else ""
    record_path = out / f"sam_real{tag}.json"
    if args.ingest_only:
        kept = json.loads(record_path.read_text()) if record_path.is_file() else {}
        record_path.write_text(json.dumps({**kept, **meta, "ingest": rows}, indent=2))
        sweep = cost = None
    else:
        sweep = teacher_forced_sweep(groups, sam_options)
        cost = step_cost(groups)
        print("drafter step", json.dumps(cost), flush=True)
        record_path.write_text(
            json.dumps({**meta, "ingest": rows, "teacher_forced": sweep, "step_cost": cost}, indent=2)
        )
    lines = [
        f"# SAM on a real model's token ids ({args.model})",
        "",
        f"Produced by `python -m recipe.bench sam-real --prompts {args.prompts} --n {args.n} --max-tokens "
        f"{args.max_tokens} --repeats {args.repeats} --split {args.split}{options_flags}"
        f"{' --ingest-only' if args.ingest_only else ''}`: {meta['tokens']:,} tokens of the model's own responses at "
        f"temperature 1 ({distinct:,} distinct ids of a 49,152-token vocabulary; {meta['mean_prompt_corpus_tokens']:.0f}"
        " tokens per prompt's corpus), stored as SAM's group corpora store them (3 lead tokens, response, separator);"
        " beside them the standard library's bytes, cut to the same length, in the same run. Medians of "
        f"{args.repeats}.",
        "",
        "| corpus | M tokens/s | bytes per token |",
        "|---|---|---|",
        *(f"| {k} | {v['tokens_per_s'] / 1e6:.2f} | {v['bytes_per_token']:.1f} |" for k, v in rows.items()),
    ]
    (out / f"sam_ingest{tag}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    if sweep is None:
        return
    tf = [
        f"# Teacher-forced drafting on {args.model}'s own rollouts, SAM vs vLLM suffix, thresholds swept",
        "",
        f"Produced by `python -m recipe.bench sam-real --prompts {args.prompts} --n {args.n} --split "
        f"{args.split}{options_flags}` on the same {meta['tokens']:,} tokens (temperature 1; prompts of the word problems' "
        f"{args.split} split), K = {sweep['k']}. SAM: configs/spec/sam.yaml's options{over}, one pass per threshold: the "
        "payoff rule's cut at that cost per draft token (each row drafts "
        + (
            "from the source whose draft gains most at that cost under the learned chances"
            if sweep["scored"]
            else "from the source with the longest match (`scored: false`)"
        )
        + ", and sends the tokens whose learned chance exceeds it); suffix: Arctic's "
        "cache with configs/spec/suffix.yaml's options at each min_token_prob. SAM at suffix's drafting: SAM's "
        "accepted tokens per position interpolated at the drafted tokens per position of each suffix row.",
        "",
        "| drafter | threshold | drafted / position | accepted / position | acceptance | SAM at this drafting | SAM / suffix |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in sweep["rows"]:
        at = row.get("sam_at_equal_drafting")
        tf.append(
            f"| {row['drafter']} | {row['threshold']} | {row['drafted_per_position']:.3f} | "
            f"{row['accepted_per_position']:.3f} | {row['acceptance']:.3f} | "
            + ("-" if at is None else f"{at:.3f}")
            + " | "
            + ("-" if at is None else f"{at / row['accepted_per_position']:.2f}x")
            + " |"
        )
    tf += [
        "",
        "The compiled drafter's step over 8 of these prompts' 64 responses at once, after an epoch of them "
        "(`step_cost`: steps of at least 32 rows, one token per row, this CPU): "
        f"{cost['scored']['median_ms']:.3f} ms median ({cost['scored']['mean_ms']:.3f} mean, with the recounts) scored "
        "with every prompt's responses (`scored`, `global_sharing`: the default), "
        f"{cost['longest_match']['median_ms']:.3f} ms ({cost['longest_match']['mean_ms']:.3f}) by the longest match.",
    ]
    (out / f"sam_teacher_forced{tag}.md").write_text("\n".join(tf) + "\n")
    print("\n".join(tf))


if __name__ == "__main__":
    main()
