"""How far an MTP head is from one fitted to the policy it drafts for: the online head's "acceptance within 2% of its
start", measured on the text each policy writes, with the easier text that RL leaves taken out.

    python -m recipe.bench head-fit --start artifacts/models/smollm2-135m-instruct-mtp-512-acceptance \\
        --policy "step 8=runs/spec-rollout-dapo/<run>/global_step_8/actor" --policy "step 12=..."

For the starting checkpoint and each policy checkpoint of a run that started from it:
1. sample ``--train-prompts`` x ``--n`` responses from the policy (train prompts, T=1) and fine-tune the *starting*
   head on the policy's trunk on them with the trunk frozen (``recipe.head_training.train_head``, the acceptance
   objective): the refit head, what the starting head becomes when fitted to that policy offline;
2. sample ``--eval-prompts`` x ``--eval-n`` held-out responses from the policy and score three heads on them with the
   policy's own distribution (``recipe.head_training.held_out_acceptance``, no sampling noise): the starting head (what
   a frozen-head run drafts with), the policy's own head (an online run's), and the refit head.

A head's fit to a policy is its acceptance over the refit head's on that policy's text. At the start the refit is the
starting head fitted some more, so the start's fit is the baseline; a head that keeps up with the policy keeps its fit
near the baseline as the policy drifts, whatever the drift does to how predictable the text is. The run's own
acceptance (it rises as the responses shorten) and the drift probe (the starting policy's text, which the policy no
longer writes) each mix the head's fit with the text.

Writes ``<out>/head_refit_gap.{json,md}``.
"""

from __future__ import annotations

import argparse
import copy
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path

from mtp.checkpoint import labelled_checkpoint, load_checkpoint, load_tokenizer, with_start_head
from recipe.paths import REPO_ROOT

HEADS = ("start", "own", "refit")  # the frozen head, the policy's own (online) head, the starting head refitted to it


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--start", type=Path, help="the starting checkpoint, with the frozen head (required to measure)"
    )
    parser.add_argument("--policy", type=labelled_checkpoint, action="append", default=[], help="LABEL=CHECKPOINT_DIR")
    parser.add_argument("--train-prompts", type=int, default=128, help="train prompts the refit's data is sampled on")
    parser.add_argument(
        "--first-prompt", type=int, default=128,
        help="the first of them (128: past the starting head's own 128, so the refit sees new text at the start too)",
    )  # fmt: skip
    parser.add_argument("--n", type=int, default=4, help="responses per train prompt")
    parser.add_argument("--eval-prompts", type=int, default=32, help="held-out prompts the heads are scored on")
    parser.add_argument("--eval-n", type=int, default=4, help="responses per held-out prompt")
    parser.add_argument("--max-tokens", type=int, default=256, help="response budget (the experiment's)")
    parser.add_argument("--epochs", type=int, default=2, help="refit epochs")
    parser.add_argument("--lr", type=float, default=3e-4, help="refit rate (the acceptance fine-tune's)")
    parser.add_argument("--dtype", default="float32", help="sampling engine and trunk dtype (the experiment's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "results" / "real" / "online_vs_frozen")
    parser.add_argument(
        "--start-row", type=Path,
        help="an earlier head_refit_gap.json of the same --start and settings: its start row is taken, not re-measured "
        "(the start's long responses make it the slowest policy)",
    )  # fmt: skip
    parser.add_argument("--report-only", action="store_true", help="re-write the .md from <out>/head_refit_gap.json")
    args = parser.parse_args()
    if args.report_only:
        write_report(json.loads((args.out / "head_refit_gap.json").read_text()), args.out)
        return
    if args.start is None:
        parser.error("--start is required: the starting checkpoint, with the frozen head")
    if not (args.start / "config.json").is_file():
        parser.error(f"--start {args.start}: holds no config.json (a checkpoint directory)")
    # the settings a start row must share to be reused: every number the measurement depends on
    settings = {k: v for k, v in vars(args).items() if isinstance(v, int | float) and not isinstance(v, bool)}
    settings["dtype"] = args.dtype
    reused = []
    if args.start_row:
        if not args.start_row.is_file():
            parser.error(f"--start-row {args.start_row}: no such file")
        if not args.policy:
            parser.error("--start-row without --policy: nothing left to measure")
        earlier = json.loads(args.start_row.read_text())
        reused = [r for r in earlier["rows"] if r["policy"] == "start"]
        if not reused or reused[0]["checkpoint"] != str(args.start):
            parser.error(f"--start-row {args.start_row}: holds no start row measured on --start {args.start}")
        if earlier.get("settings") != settings:
            parser.error(f"--start-row {args.start_row}: measured with {earlier.get('settings')}, not {settings}")

    import torch

    from recipe.dapo.data import load_prompts
    from recipe.data.word_problems import write_splits
    from recipe.head_training import held_out_acceptance, held_out_prompts, own_samples, train_head

    dtype = getattr(torch, args.dtype)
    start = load_checkpoint(args.start, dtype)
    train_file, _ = write_splits()
    _, train_prompts = load_prompts(
        str(train_file), load_tokenizer(args.start), 512, args.first_prompt + args.train_prompts
    )
    train_prompts = train_prompts[args.first_prompt :]
    eval_prompts = held_out_prompts(args.start, args.eval_prompts)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = list(reused)
    # the start last: its long responses make it the slowest, and the policies check the pipeline first
    for label, path in [*args.policy, *([] if reused else [("start", args.start)])]:
        t0 = time.time()
        policy = load_checkpoint(path, dtype)
        own = copy.deepcopy(policy.model.mtp_layers)
        train, train_summary = own_samples(path, train_prompts, args.n, args.max_tokens, args.seed, args.dtype)
        held_out, eval_summary = own_samples(
            path, eval_prompts, args.eval_n, args.max_tokens, args.seed + 1, args.dtype
        )
        with tempfile.TemporaryDirectory() as tmp:
            swapped = with_start_head(copy.deepcopy(policy), path, start.model.mtp_layers, Path(tmp) / "start_head")
            refit_dir, history, _ = train_head(
                swapped, train, Path(tmp) / "refit", epochs=args.epochs, lr=args.lr, seed=args.seed, dtype=dtype,
                objective="acceptance",
            )  # fmt: skip
            refit = load_checkpoint(refit_dir, dtype).model.mtp_layers
        heads = {"start": start.model.mtp_layers, "own": own, "refit": refit}
        scores = held_out_acceptance(policy, heads, held_out)
        row = {
            "policy": label,
            "checkpoint": str(path),
            "train_responses": len(train),
            "train_response_tokens": int(train_summary["tokens"]),
            "eval_response_tokens": int(eval_summary["tokens"]),
            "refit_steps": len(history),
            "seconds": time.time() - t0,
            **{f"{head}_{reading}": scores[head][reading] for head in HEADS for reading in ("accepted", "earned")},
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
        report = {"command": shlex.join(sys.argv[1:]), "settings": settings, "rows": rows}
        # written after every policy: nothing lost
        (args.out / "head_refit_gap.json").write_text(json.dumps(report, indent=1))
    write_report(report, args.out)


def write_report(report: dict, out: Path) -> None:
    """``head_refit_gap.md``: each head's earned acceptance and its fit (over the refit head's), each fit's change
    against the start's, which is the baseline both heads are read against."""
    rows, settings = report["rows"], report["settings"]
    first = next(row for row in rows if row["policy"] == "start")
    fit = [{head: row[f"{head}_earned"] / row["refit_earned"] for head in HEADS} for row in rows]
    base = fit[rows.index(first)]
    lines = [
        f"Produced by `python -m recipe.bench head-fit {report['command']}`.",
        "",
        "Expected acceptance of one probabilistic draft, `sum(min(p, q))` under the policy's own distribution at T=1, on "
        f"{settings['eval_prompts']} held-out prompts x {settings['eval_n']} responses the policy sampled itself, over "
        "the drafts that can earn a token (a response's last token left out; all drafts in brackets). Heads: start = "
        "the starting head (what a frozen-head run drafts with); own = the checkpoint's own head (an online run's); "
        f"refit = the starting head fine-tuned on the policy's trunk on {settings['train_prompts']} x {settings['n']} "
        f"of its responses to train prompts ({settings['epochs']} epochs of the acceptance objective at "
        f"{settings['lr']:g}). Fit = a head's acceptance over the refit head's, and its change from the start's fit.",
        "",
        "| policy | train response tokens | start head | own head | refit head | start head's fit | own head's fit |",
        "|---|---|---|---|---|---|---|",
    ]
    for i in sorted(range(len(rows)), key=lambda i: rows[i] is not first):  # the start, then in the order measured
        row = rows[i]
        cells = [
            row["policy"],
            str(row["train_response_tokens"]),
            *(f"{row[f'{head}_earned']:.3f} ({row[f'{head}_accepted']:.3f})" for head in HEADS),
            *(f"{fit[i][head]:.3f} ({fit[i][head] / base[head] - 1:+.1%})" for head in ("start", "own")),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    (out / "head_refit_gap.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
