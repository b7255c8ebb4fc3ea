"""Replay an online MTP head's first steps of DAPO on the starting policy's own samples (KL 0): what the optimizer's
first steps cost the head's acceptance at each learning rate and warm-up, with no policy change to blame.

In both 12-step smollm2 runs the online head lost 6-7% of its sampled-draft acceptance in step 1, at a KL from the
start of 0.007 (results/real/README.md). This replays what the trainer does to the head in those steps: 2 mini-batches
of 16 responses per step (``configs/experiment/smollm2.yaml``), the MTP loss scaled by
``spec.mtp.loss_scaling_factor`` (0.2), its own grad clip (1.0), AdamW with the actor's betas, one scheduler step per
training step. The data are responses the starting policy sampled itself on prompts its head never trained on
(a ``graft_mtp_real.py`` sample set), trained on in order; the score is the drift probe's (``recipe.dapo.drift``):
the expected acceptance of a sampled draft, ``sum(min(p, q))``, over the set's last responses (other prompts).

With ``--trunk`` (a policy checkpoint after RL) the starting head drafts for that policy instead, as a frozen head
does after a run: the replay then shows how fast each setting wins back what the drift cost, teacher-forced on the
same text. A config's third field is ``spec.mtp.loss_vocab_topk`` (the loss over a shortlist of the vocabulary).

    .venv/bin/python scripts/online_head_replay.py --configs 3e-4:0,3e-4:4,1e-4:0,3e-5:0
"""

from __future__ import annotations

import argparse
import copy
import json
import shlex
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from mtp import MTP_OBJECTIVES  # noqa: E402


def shown(path: str) -> str:
    """``path`` relative to the repository where it lies inside it (as the report names files)."""
    resolved = Path(path).resolve()
    return str(resolved.relative_to(REPO_ROOT)) if resolved.is_relative_to(REPO_ROOT) else path


def mean_acceptance(model, layers, head, packs) -> float:
    """Mean over the packs' trained positions of ``sum(min(p, q))``: a sampled draft's chance of acceptance."""
    import torch

    from mtp.head_training import draft_and_target
    from mtp.loss import expected_acceptance

    total, count = 0.0, 0
    with torch.no_grad():
        for c in packs:
            logits, teacher = draft_and_target(model, layers, head, c)
            total += float(expected_acceptance(logits, teacher).sum())
            count += int(logits.shape[0])
    return total / max(count, 1)


def shortlist_coverage(model, packs, topk: int) -> dict[str, float]:
    """How wide :func:`mtp.loss.draft_vocabulary` is on each pack, and how much of the target's distribution of the
    drafted token it holds: the mass a head trained over it is never scored on."""
    import torch

    from mtp.head_training import target_logits
    from mtp.loss import draft_vocabulary

    sizes, masses = [], []
    with torch.no_grad():
        for c in packs:
            logits = target_logits(model, c)
            vocab = draft_vocabulary(logits, c.targets, topk)
            sizes.append(vocab.numel())
            masses.append(torch.softmax(logits, dim=-1)[:, vocab].sum(-1))
    mass = torch.cat(masses)
    return {"tokens": sum(sizes) / len(sizes), "mass": float(mass.mean()), "min_mass": float(mass.min())}


def label(r: dict) -> str:
    vocab = f"top-{r['vocab_topk']} shortlist" if r["vocab_topk"] else "every token"
    return f"lr {r['lr']:g}, warm-up {r['warmup_steps']}, {vocab}"


def plot(results: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    for r in results:
        start = r["acceptance"][0]
        change = [(a / start - 1) * 100 for a in r["acceptance"]]
        ax.plot(range(len(change)), change, marker="o", label=label(r))
    ax.axhspan(-2, 2, color="0.9", zorder=0, label="within 2%")
    ax.set(xlabel="training step", ylabel="sampled-draft acceptance, % from start", title=title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def replay(
    model, train_steps, eval_packs, lr: float, warmup: int, topk: int, objective: str, scale: float, clip: float
) -> tuple[list[float], float]:
    """The head's acceptance after each training step (index 0: before any), and the seconds its training took (the
    loss over the whole vocabulary, or ``topk``'s shortlist of it)."""
    import time

    import torch

    from mtp.head_training import pack_loss

    layers = copy.deepcopy(model.model.mtp_layers).float().requires_grad_(True)
    head = model.lm_head.weight.detach().float()
    opt = torch.optim.AdamW(layers.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.0)
    # linear from 1/(warmup+1) of the rate to all of it over ``warmup`` training steps, as veRL's warm-up ramps
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / (warmup + 1)))
    curve = [mean_acceptance(model, layers, head, eval_packs)]
    seconds = 0.0
    for minis in train_steps:
        start = time.perf_counter()
        for c in minis:
            loss, _ = pack_loss(model, layers, head, c, objective, topk)
            opt.zero_grad(set_to_none=True)
            (scale * loss).backward()
            torch.nn.utils.clip_grad_norm_(layers.parameters(), clip)
            opt.step()
        sched.step()
        seconds += time.perf_counter() - start
        curve.append(mean_acceptance(model, layers, head, eval_packs))
    return curve, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    models = REPO_ROOT / "artifacts" / "models"
    parser.add_argument("--checkpoint", default=str(models / "smollm2-135m-instruct-mtp"), help="the starting head")
    parser.add_argument(
        "--samples",
        default=str(models / "smollm2-135m-instruct-mtp-samples-f128-p384-n4-t384-s1-float32.pkl"),
        help="responses of prompts the starting head never trained on, in prompt order: the replay trains on the "
        "first, scores on the last",
    )
    parser.add_argument("--eval-responses", type=int, default=64)
    parser.add_argument("--steps", type=int, default=8, help="training steps replayed")
    parser.add_argument("--responses-per-mini", type=int, default=16, help="ppo_mini_batch_size x rollout.n")
    parser.add_argument("--minis", type=int, default=2, help="optimizer steps per training step")
    parser.add_argument(
        "--configs",
        default="3e-4:0,3e-4:4,1e-4:0,3e-5:0",
        help="lr:warm-up steps[:spec.mtp.loss_vocab_topk], comma-separated",
    )
    parser.add_argument(
        "--trunk", help="a policy checkpoint (after RL) whose trunk the starting head drafts for (default: its own)"
    )
    parser.add_argument("--objective", default="distill", choices=MTP_OBJECTIVES)
    parser.add_argument("--loss-scale", type=float, default=0.2, help="spec.mtp.loss_scaling_factor")
    parser.add_argument("--clip", type=float, default=1.0, help="actor.grad_clip (the head's own norm)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(REPO_ROOT / "results" / "real" / "online_head_replay"))
    args = parser.parse_args()

    import numpy as np
    import torch

    from mtp.checkpoint import load_checkpoint
    from mtp.head_training import cache_trunk, load_samples
    from recipe.sft.train import pack_batches

    configs = []
    for item in args.configs.split(","):
        fields = item.split(":")
        try:
            lr, warmup, topk = float(fields[0]), *(int(f) for f in (fields[1:] + ["0", "0"])[:2])
        except ValueError:
            lr = warmup = topk = -1
        if len(fields) > 3 or lr <= 0 or warmup < 0 or topk < 0:
            parser.error(f"--configs {item!r}: expected lr:warmup_steps[:vocab_topk], e.g. 3e-4:4 or 1e-4:0:32")
        configs.append((lr, warmup, topk))

    try:
        train, _ = load_samples(args.samples)
    except FileNotFoundError as err:
        parser.error(str(err))
    torch.manual_seed(args.seed)
    model = load_checkpoint(args.checkpoint, torch.float32)
    model.requires_grad_(False)
    held_out, train = train[-args.eval_responses :], train[: -args.eval_responses]
    needed = args.steps * args.minis * args.responses_per_mini
    if len(train) < needed:
        parser.error(f"--samples holds {len(train)} responses besides the scored ones; {needed} are replayed")
    eval_batches = pack_batches(held_out, 4096, np.random.default_rng(args.seed))
    own_policy = None
    if args.trunk:
        # the head's acceptance for the policy it was trained with, before that policy is swapped for the drifted one
        own_policy = mean_acceptance(
            model, model.model.mtp_layers, model.lm_head.weight, cache_trunk(model, eval_batches, progress=False)
        )
        head = model.model.mtp_layers.state_dict()
        model = load_checkpoint(args.trunk, torch.float32)
        model.requires_grad_(False)
        model.model.mtp_layers.load_state_dict(head)
    minis = [train[i : i + args.responses_per_mini] for i in range(0, needed, args.responses_per_mini)]
    cached = cache_trunk(model, minis)
    steps = [cached[i : i + args.minis] for i in range(0, len(cached), args.minis)]
    eval_packs = cache_trunk(model, eval_batches)
    coverage = {k: shortlist_coverage(model, eval_packs, k) for k in sorted({c[2] for c in configs} - {0})}
    results = []
    for lr, warmup, topk in configs:
        curve, seconds = replay(model, steps, eval_packs, lr, warmup, topk, args.objective, args.loss_scale, args.clip)
        results.append({"lr": lr, "warmup_steps": warmup, "vocab_topk": topk, "acceptance": curve, "train_s": seconds})
        print(json.dumps(results[-1]), flush=True)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"args": vars(args), "own_policy_acceptance": own_policy, "coverage": coverage, "results": results}
    (out / "replay.json").write_text(json.dumps(report, indent=2))
    start = results[0]["acceptance"][0]
    header = " | ".join(f"step {k}" for k in range(1, args.steps + 1))
    command = " ".join(shlex.quote(a) for a in sys.argv[1:])
    if args.trunk:
        title = "the starting head on a drifted policy"
        setting = (
            f"Starting head: `{shown(args.checkpoint)}`, drafting for the policy `{shown(args.trunk)}` (its trunk, "
            f"embeddings and LM head); on its own policy the head scores {own_policy:.4f} on the same text, on this "
            f"one {start:.4f} ({(start / own_policy - 1) * 100:+.1f}%). Each step trains it on"
        )
    else:
        title = "the online head at KL 0"
        setting = f"Starting head: `{shown(args.checkpoint)}`; each step trains it on"
    lines = [
        f"# Replayed online steps: {title}",
        "",
        f"Produced by `.venv/bin/python scripts/online_head_replay.py {command}` on this CPU (float32). {setting} "
        f"{args.minis} x {args.responses_per_mini} of the starting policy's own responses (`{shown(args.samples)}`) "
        f"with the {args.objective} objective; the score is the expected acceptance of a sampled draft over the "
        f"set's last {len(held_out)} responses (start {start:.4f}), and its change from the start. Head training "
        "seconds are the steps' own, without the scoring.",
        "",
        f"| learning rate | warm-up steps | loss over | head training (s) | {header} |",
        "|---|---|---|---|" + "---|" * args.steps,
    ]
    for r in results:
        cells = " | ".join(f"{a:.4f} ({(a / start - 1) * 100:+.1f}%)" for a in r["acceptance"][1:])
        vocab = f"top-{r['vocab_topk']} shortlist" if r["vocab_topk"] else "every token"
        lines.append(f"| {r['lr']:g} | {r['warmup_steps']} | {vocab} | {r['train_s']:.1f} | {cells} |")
    if coverage:
        lines += [
            "",
            "The shortlists on the scored text (per pack of about 4,096 tokens, as a micro-batch's):",
            "",
            "| k | tokens in the shortlist (mean) | teacher's mass inside it (mean) | (lowest position) |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| {k} | {c['tokens']:.0f} of {model.config.vocab_size} | {c['mass']:.4f} | {c['min_mass']:.4f} |"
            for k, c in coverage.items()
        ]
    plot(results, out / "replay.png", title)
    lines += ["", "![replay](replay.png)"]
    (out / "README.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
