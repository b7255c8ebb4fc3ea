"""What the rollout pays to hand over the online head's teacher, side by side -> ``results/real/rollout_teacher/``.

With ``spec.mtp.train_on_dropped_groups`` and a top-k shortlist the rollout keeps, for every response token, the
policy's k likeliest tokens and the sampled token's log-prob (vLLM's processed logprobs, ``generate(teacher_topk=k)``),
so the head's steps on left-out rows need the LM head over the shortlist alone (scripts/bench_head_step.py
``--compare teacher``). Every rollout of such a run asks for them, for the groups that will be dropped are not known
until their rewards are. vLLM would decode each of the k + 1 tokens of every position, so those requests are not
detokenized in the engine and their text is decoded once at the end. This times the experiment's rollout (``+experiment=smollm2``: the grafted head drafting, T=1,
trunk states kept) on one engine with and without the teacher, in pairs from the same sampler seed, alternating which
goes first.

    .venv/bin/python scripts/bench_rollout_teacher.py --model artifacts/models/smollm2-135m-instruct-mtp-512-acceptance
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "scripts"))
from bench_mtp_overhead import compose  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="an MTP checkpoint (scripts/graft_mtp_real.py's)")
    parser.add_argument("--prompts", type=int, default=16, help="word problems per rollout (data.gen_batch_size)")
    parser.add_argument("--pairs", type=int, default=3, help="rollouts per way, in pairs from one sampler seed")
    parser.add_argument("--out", default=str(REPO_ROOT / "results" / "real" / "rollout_teacher"))
    args = parser.parse_args()

    from mtp.checkpoint import load_tokenizer
    from recipe.dapo.rollout import rollout_engine
    from recipe.data.loader import load_problems
    from recipe.data.word_problems import write_splits
    from recipe.sft.train import encode_prompt

    overrides = ["+experiment=smollm2", "spec.mtp.train=online", "spec.mtp.train_on_dropped_groups=true"]
    cfg = compose(overrides)
    topk = int(cfg.spec.mtp.loss_vocab_topk)
    ro = cfg.actor_rollout_ref.rollout
    tok = load_tokenizer(Path(args.model))
    problems = load_problems(write_splits()[0], max_rows=args.prompts)
    prompts = [encode_prompt(tok, p.messages) for p in problems]
    sampling = {"temperature": ro.temperature, "top_p": ro.top_p, "max_tokens": cfg.data.max_response_length}
    engine = rollout_engine(cfg, args.model, topk)
    rows = []
    try:
        engine.reseed(10_000)  # a warm-up rollout on the same prompts
        engine.generate(prompts, int(ro.n), sampling, keep_trunk_states=True, teacher_topk=topk)
        for pair in tqdm(range(args.pairs), desc="pairs"):
            row: dict[str, float | int | bool] = {"pair": pair}
            tokens, texts = {}, {}
            for k in (0, topk) if pair % 2 == 0 else (topk, 0):
                engine.reseed(pair)
                start = time.perf_counter()
                result = engine.generate(prompts, int(ro.n), sampling, keep_trunk_states=True, teacher_topk=k)
                seconds = time.perf_counter() - start
                way = "teacher" if k else "plain"
                tokens[way] = [r.token_ids for r in result.responses]
                texts[way] = [r.text for r in result.responses]
                row[f"{way}_s"] = seconds
                row[f"{way}_tokens"] = sum(len(t) for t in tokens[way])
            row["same_tokens"] = tokens["teacher"] == tokens["plain"]
            # vLLM's text without the teacher, the tokenizer's with it (not detokenized in the engine)
            row["same_text"] = texts["teacher"] == texts["plain"]
            row["teacher_over_plain"] = (row["teacher_s"] / row["teacher_tokens"]) / (
                row["plain_s"] / row["plain_tokens"]
            )
            rows.append(row)
            tqdm.write(json.dumps(row))
    finally:
        engine.close()
    ratios = np.array([r["teacher_over_plain"] for r in rows])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "rollout_teacher.json").write_text(json.dumps(rows, indent=2))
    lines = [
        f"Produced by `.venv/bin/python scripts/bench_rollout_teacher.py --model {args.model} --prompts {args.prompts} "
        f"--pairs {args.pairs}`: the experiment's rollout ({args.prompts} word problems x {ro.n}, T={ro.temperature}, "
        f"the grafted head drafting, trunk states kept) on one engine, without and with the top-{topk} teacher "
        "(vLLM's log-probs of every response token), in pairs from one sampler seed, alternating which goes first. "
        "Seconds per response token; the ratio is with / without.",
        "",
        "| pair | without (s) | tokens | with (s) | tokens | same tokens | same text | with / without, per token |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['pair']} | {r['plain_s']:.1f} | {r['plain_tokens']} | {r['teacher_s']:.1f} | {r['teacher_tokens']} "
            f"| {r['same_tokens']} | {r['same_text']} | {r['teacher_over_plain']:.3f}x |"
        )
    lines += ["", f"Median with / without: **{np.median(ratios):.3f}x** (range {ratios.min():.3f}-{ratios.max():.3f})."]
    (out / "rollout_teacher.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
