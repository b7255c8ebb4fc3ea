"""The online head's step on left-out rows two ways, side by side -> ``results/real/head_step/head_step_<compare>.md``:
each shared prompt run once vs every row's (``--compare prompt``), or the teacher from the rollout's log-probs vs the LM
head over the whole vocabulary (``--compare teacher``).

``spec.mtp.train_on_dropped_groups`` trains the MTP head alone on responses the policy's update leaves out, from the
rollout's trunk states (``recipe.dapo.policy.head_loss_rows``). A row there costs its response (the teacher's LM head
and the MTP layer at each trained position) and its prompt (the MTP layer's attention inputs over 108-132 prompt
tokens): on the short responses a DAPO run ends with, the prompt was most of it (results/real/online_vs_frozen_1129,
"The token cap at 1.0"). A DAPO group's responses share their prompt, so the layer can run over it once
(``mtp.model.SharedPrompts``). This times one forward and backward of the head's loss per micro-batch over the same
rows both ways, alternating, for groups of ``--rows-per-group`` rows (the cap draws a row of every group before a
second of any) and responses of ``--response-tokens`` tokens of the model's own text.

Of what is left, about half is the teacher: the policy's LM head over SmolLM2's 49,152-token vocabulary at every trained
position, for a top-32 shortlist and a normaliser. The rollout engine computed that distribution when it sampled the
token, and vLLM hands over its top-k and the sampled token's log-prob (``generate(teacher_topk=k)``), from which the
LM head over the shortlist alone gives the same loss (``mtp.loss.teacher_probs_from_logprob``); ``--compare teacher``
times the two with the prompt run once both ways.

    .venv/bin/python scripts/bench_head_step.py --model artifacts/models/smollm2-135m-instruct-mtp-512-acceptance \\
        --samples artifacts/models/smollm2-135m-instruct-mtp-samples-p128-n4-t256-s0-float32.pkl
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "scripts"))
from bench_mtp_overhead import compose, real_model_batch  # noqa: E402

# per comparison: (the change's name, the name of what it is compared with)
WAYS = {"prompt": ("prompt once", "every row's prompt"), "teacher": ("rollout's teacher", "whole-vocabulary teacher")}


def head_pass(model, batch, cfg, share: bool) -> None:
    """The head's loss and its backward over ``batch``'s micro-batches, as ``Actor.train_head`` runs them (a batch
    that carries the rollout's teacher takes it from there)."""
    from recipe.dapo.policy import head_loss_rows

    mtp = cfg.spec.mtp
    micro = int(cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu)
    for start in range(0, len(batch), micro):
        loss, _ = head_loss_rows(
            model, batch[start : start + micro], float(cfg.actor_rollout_ref.rollout.temperature),
            float(mtp.loss_sequence_fraction), str(mtp.objective), int(mtp.loss_vocab_topk), share_prompts=share,
        )  # fmt: skip
        loss.backward()
    model.zero_grad(set_to_none=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="an MTP checkpoint (scripts/graft_mtp_real.py's)")
    parser.add_argument("--samples", required=True, help="a scripts/graft_mtp_real.py sample set: the model's own text")
    parser.add_argument("--groups", type=int, default=12, help="prompt groups of left-out rows")
    parser.add_argument("--rows-per-group", default="2,4,8", help="left-out rows drawn per group")
    parser.add_argument("--response-tokens", default="16,32,128", help="tokens per response")
    parser.add_argument("--reps", type=int, default=7, help="timed passes per way and shape")
    parser.add_argument("--compare", choices=sorted(WAYS), default="teacher", help="what the two ways differ in")
    parser.add_argument("--out", default=str(REPO_ROOT / "results" / "real" / "head_step"))
    args = parser.parse_args()

    import torch

    from mtp.checkpoint import load_checkpoint
    from recipe.dapo.policy import own_trunk_states

    torch.manual_seed(0)
    ckpt = Path(args.model)
    cfg = compose(["+experiment=smollm2", "spec.mtp.train=online", "spec.mtp.train_on_dropped_groups=true"])
    topk, temperature = int(cfg.spec.mtp.loss_vocab_topk), float(cfg.actor_rollout_ref.rollout.temperature)
    model = load_checkpoint(ckpt).float()
    n = int(cfg.actor_rollout_ref.rollout.n)
    shapes = [(int(r), int(k)) for r in args.response_tokens.split(",") for k in args.rows_per_group.split(",")]
    rows = []
    for response_tokens, per_group in tqdm(shapes, desc="shapes"):
        if not 1 <= per_group <= n:
            raise SystemExit(f"--rows-per-group {per_group}: a group has 1 to {n} rows (rollout.n)")
        full = real_model_batch(ckpt, args.groups, n, response_tokens, response_tokens, Path(args.samples))
        picked = full[[g * n + i for g in range(args.groups) for i in range(per_group)]]
        with_teacher = own_trunk_states(model, picked, topk, temperature)
        without_teacher = copy.deepcopy(with_teacher)
        for key in ("teacher_topk", "token_logprobs"):
            without_teacher.non_tensor_batch.pop(key)
        # way True is the change, way False what it is compared with: (rows, share_prompts)
        teacher = args.compare == "teacher"
        ways = {True: (with_teacher if teacher else without_teacher, True), False: (without_teacher, teacher)}
        times: dict[bool, list[float]] = {True: [], False: []}
        for way in (True, False):  # a warm-up pass each
            head_pass(model, ways[way][0], cfg, ways[way][1])
        for rep in range(args.reps):
            for way in (True, False) if rep % 2 == 0 else (False, True):
                start = time.perf_counter()
                head_pass(model, ways[way][0], cfg, ways[way][1])
                times[way].append(time.perf_counter() - start)
        change, base = np.array(times[True]), np.array(times[False])
        row = {
            "response_tokens": response_tokens,
            "rows_per_group": per_group,
            "rows": len(without_teacher),
            "prompt_tokens": int(
                without_teacher.batch["attention_mask"].sum() - without_teacher.batch["response_mask"].sum()
            ),
            "change_s": float(np.median(change)),
            "base_s": float(np.median(base)),
            "change_over_base": float(np.median(change / base)),
            "change_over_base_q25": float(np.percentile(change / base, 25)),
            "change_over_base_q75": float(np.percentile(change / base, 75)),
        }
        rows.append(row)
        tqdm.write(json.dumps(row))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"head_step_{args.compare}.json").write_text(json.dumps(rows, indent=2))
    new, old = WAYS[args.compare]
    mtp = cfg.spec.mtp
    lines = [
        f"Produced by `.venv/bin/python scripts/bench_head_step.py --model {args.model} --samples {args.samples} "
        f"--groups {args.groups} --rows-per-group {args.rows_per_group} --response-tokens {args.response_tokens} "
        f"--reps {args.reps} --compare {args.compare}`: the online head's loss and backward (`+experiment=smollm2`: "
        f"`objective={mtp.objective}`, `loss_sequence_fraction={mtp.loss_sequence_fraction}`, "
        f"`loss_vocab_topk={mtp.loss_vocab_topk}`, micro-batches of "
        f"{cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu}) over the rows of {args.groups} prompt groups, "
        f"with the {new} and the {old}, alternating; medians of "
        f"{args.reps} passes, the ratio the median of the per-pass ratios (interquartile range in brackets). "
        "The optimizer step, the same both ways, is left out.",
        "",
        f"| response tokens | rows per group | rows | {new} (s) | {old} (s) | per row, {new} / {old} (ms) "
        f"| {new} / {old} |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['response_tokens']} | {r['rows_per_group']} | {r['rows']} | {r['change_s']:.3f} | {r['base_s']:.3f} | "
            f"{1000 * r['change_s'] / r['rows']:.1f} / {1000 * r['base_s'] / r['rows']:.1f} | "
            f"{r['change_over_base']:.3f}x [{r['change_over_base_q25']:.3f}, {r['change_over_base_q75']:.3f}] |"
        )
    (out / f"head_step_{args.compare}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
