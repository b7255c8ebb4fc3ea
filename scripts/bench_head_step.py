"""The online head's step on left-out rows with each shared prompt run once vs every row's, side by side ->
``results/real/head_step/``.

``spec.mtp.train_on_dropped_groups`` trains the MTP head alone on responses the policy's update leaves out, from the
rollout's trunk states (``recipe.dapo.policy.head_loss_rows``). A row there costs its response (the teacher's LM head
and the MTP layer at each trained position) and its prompt (the MTP layer's attention inputs over 108-132 prompt
tokens): on the short responses a DAPO run ends with, the prompt was most of it (results/real/online_vs_frozen_1129,
"The token cap at 1.0"). A DAPO group's responses share their prompt, so the layer can run over it once
(``mtp.model.SharedPrompts``). This times one forward and backward of the head's loss per micro-batch over the same
rows both ways, alternating, for groups of ``--rows-per-group`` rows (the cap draws a row of every group before a
second of any) and responses of ``--response-tokens`` tokens of the model's own text.

    .venv/bin/python scripts/bench_head_step.py --model artifacts/models/smollm2-135m-instruct-mtp-512-acceptance \\
        --samples artifacts/models/smollm2-135m-instruct-mtp-samples-p128-n4-t256-s0-float32.pkl
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
from bench_mtp_overhead import compose, real_model_batch  # noqa: E402


def head_pass(model, batch, cfg, share: bool) -> None:
    """The head's loss and its backward over ``batch``'s micro-batches, as ``Actor.train_head`` runs them."""
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
    parser.add_argument("--out", default=str(REPO_ROOT / "results" / "real" / "head_step"))
    args = parser.parse_args()

    import torch

    from mtp.checkpoint import load_checkpoint
    from recipe.dapo.policy import own_trunk_states

    torch.manual_seed(0)
    ckpt = Path(args.model)
    cfg = compose(["+experiment=smollm2", "spec.mtp.train=online", "spec.mtp.train_on_dropped_groups=true"])
    model = load_checkpoint(ckpt).float()
    n = int(cfg.actor_rollout_ref.rollout.n)
    shapes = [(int(r), int(k)) for r in args.response_tokens.split(",") for k in args.rows_per_group.split(",")]
    rows = []
    for response_tokens, per_group in tqdm(shapes, desc="shapes"):
        if not 1 <= per_group <= n:
            raise SystemExit(f"--rows-per-group {per_group}: a group has 1 to {n} rows (rollout.n)")
        full = real_model_batch(ckpt, args.groups, n, response_tokens, response_tokens, Path(args.samples))
        batch = own_trunk_states(model, full[[g * n + i for g in range(args.groups) for i in range(per_group)]])
        times: dict[bool, list[float]] = {True: [], False: []}
        for share in (True, False):  # a warm-up pass each
            head_pass(model, batch, cfg, share)
        for rep in range(args.reps):
            for share in (True, False) if rep % 2 == 0 else (False, True):
                start = time.perf_counter()
                head_pass(model, batch, cfg, share)
                times[share].append(time.perf_counter() - start)
        once, each = np.array(times[True]), np.array(times[False])
        row = {
            "response_tokens": response_tokens,
            "rows_per_group": per_group,
            "rows": len(batch),
            "prompt_tokens": int(batch.batch["attention_mask"].sum() - batch.batch["response_mask"].sum()),
            "once_s": float(np.median(once)),
            "each_s": float(np.median(each)),
            "once_over_each": float(np.median(once / each)),
            "once_over_each_q25": float(np.percentile(once / each, 25)),
            "once_over_each_q75": float(np.percentile(once / each, 75)),
        }
        rows.append(row)
        tqdm.write(json.dumps(row))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "head_step.json").write_text(json.dumps(rows, indent=2))
    mtp = cfg.spec.mtp
    lines = [
        f"Produced by `.venv/bin/python scripts/bench_head_step.py --model {args.model} --samples {args.samples} "
        f"--groups {args.groups} --rows-per-group {args.rows_per_group} --response-tokens {args.response_tokens} "
        f"--reps {args.reps}`: the online head's loss and backward (`+experiment=smollm2`: "
        f"`objective={mtp.objective}`, `loss_sequence_fraction={mtp.loss_sequence_fraction}`, "
        f"`loss_vocab_topk={mtp.loss_vocab_topk}`, micro-batches of "
        f"{cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu}) over the rows of {args.groups} prompt groups, "
        "with each group's prompt run once through the MTP layer and with every row's, alternating; medians of "
        f"{args.reps} passes, the ratio the median of the per-pass ratios (interquartile range in brackets). "
        "The optimizer step, the same both ways, is left out.",
        "",
        "| response tokens | rows per group | rows | prompt once (s) | every row's prompt (s) | per row, once / every (ms) "
        "| once / every |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['response_tokens']} | {r['rows_per_group']} | {r['rows']} | {r['once_s']:.3f} | {r['each_s']:.3f} | "
            f"{1000 * r['once_s'] / r['rows']:.1f} / {1000 * r['each_s'] / r['rows']:.1f} | "
            f"{r['once_over_each']:.3f}x [{r['once_over_each_q25']:.3f}, {r['once_over_each_q75']:.3f}] |"
        )
    (out / "head_step.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
