"""Replay an online MTP head's first steps of DAPO on the starting policy's own samples (KL 0): what the optimizer's
first steps cost the head's acceptance at each learning rate and warm-up, with no policy change to blame.

In both 12-step smollm2 runs the online head lost 6-7% of its sampled-draft acceptance in step 1, at a KL from the
start of 0.007 (results/real/README.md). This replays what the trainer does to the head in those steps: 2 mini-batches
of 16 responses per step (``configs/experiment/smollm2.yaml``), the MTP loss scaled by
``spec.mtp.loss_scaling_factor`` (0.2), its own grad clip (1.0), AdamW with the actor's betas, one scheduler step per
training step. The data are responses the starting policy sampled itself on prompts its head never trained on
(a ``graft_mtp_real.py`` sample set), trained on in order; the score is the drift probe's (``recipe.dapo.drift``):
the expected acceptance of a sampled draft, ``sum(min(p, q))``, over the set's last responses (other prompts).

    .venv/bin/python scripts/online_head_replay.py --configs 3e-4:0,3e-4:4,1e-4:0,3e-5:0
"""

from __future__ import annotations

import argparse
import copy
import json
import pickle
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


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    for r in results:
        start = r["acceptance"][0]
        change = [(a / start - 1) * 100 for a in r["acceptance"]]
        ax.plot(range(len(change)), change, marker="o", label=f"lr {r['lr']:g}, warm-up {r['warmup_steps']}")
    ax.axhspan(-2, 2, color="0.9", zorder=0, label="within 2%")
    ax.set(xlabel="training step", ylabel="sampled-draft acceptance, % from start", title="online head at KL 0")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def replay(model, train_steps, eval_packs, lr: float, warmup: int, objective: str, scale: float, clip: float):
    """The head's acceptance after each training step (index 0: before any)."""
    import torch

    from mtp.head_training import draft_and_target
    from mtp.loss import objective_loss

    layers = copy.deepcopy(model.model.mtp_layers).float().requires_grad_(True)
    head = model.lm_head.weight.detach().float()
    opt = torch.optim.AdamW(layers.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.0)
    # linear from 1/(warmup+1) of the rate to all of it over ``warmup`` training steps, as veRL's warm-up ramps
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / (warmup + 1)))
    curve = [mean_acceptance(model, layers, head, eval_packs)]
    for minis in train_steps:
        for c in minis:
            logits, teacher = draft_and_target(model, layers, head, c)
            loss, _ = objective_loss(objective, logits, c.targets, teacher)
            opt.zero_grad(set_to_none=True)
            (scale * loss).backward()
            torch.nn.utils.clip_grad_norm_(layers.parameters(), clip)
            opt.step()
        sched.step()
        curve.append(mean_acceptance(model, layers, head, eval_packs))
    return curve


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
    parser.add_argument("--configs", default="3e-4:0,3e-4:4,1e-4:0,3e-5:0", help="lr:warm-up steps, comma-separated")
    parser.add_argument("--objective", default="distill", choices=MTP_OBJECTIVES)
    parser.add_argument("--loss-scale", type=float, default=0.2, help="spec.mtp.loss_scaling_factor")
    parser.add_argument("--clip", type=float, default=1.0, help="actor.grad_clip (the head's own norm)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(REPO_ROOT / "results" / "real" / "online_head_replay"))
    args = parser.parse_args()

    import numpy as np
    import torch

    from mtp.checkpoint import load_checkpoint
    from mtp.head_training import cache_trunk
    from recipe.sft.train import TokenizedExample, pack_batches

    configs = []
    for item in args.configs.split(","):
        lr, _, warmup = item.partition(":")
        try:
            configs.append((float(lr), int(warmup or 0)))
        except ValueError:
            parser.error(f"--configs {item!r}: expected lr:warmup_steps, e.g. 3e-4:4")

    def samples(path: str) -> list:
        if not Path(path).is_file():
            parser.error(f"{path}: no such sample set (scripts/graft_mtp_real.py writes them)")
        arrays, _ = pickle.loads(Path(path).read_bytes())
        return [TokenizedExample(ids, mask) for ids, mask in arrays]

    torch.manual_seed(args.seed)
    model = load_checkpoint(args.checkpoint, torch.float32)
    model.requires_grad_(False)
    train = samples(args.samples)
    held_out, train = train[-args.eval_responses :], train[: -args.eval_responses]
    needed = args.steps * args.minis * args.responses_per_mini
    if len(train) < needed:
        parser.error(f"--samples holds {len(train)} responses besides the scored ones; {needed} are replayed")
    minis = [train[i : i + args.responses_per_mini] for i in range(0, needed, args.responses_per_mini)]
    cached = cache_trunk(model, minis)
    steps = [cached[i : i + args.minis] for i in range(0, len(cached), args.minis)]
    eval_packs = cache_trunk(model, pack_batches(held_out, 4096, np.random.default_rng(args.seed)))
    results = []
    for lr, warmup in configs:
        curve = replay(model, steps, eval_packs, lr, warmup, args.objective, args.loss_scale, args.clip)
        results.append({"lr": lr, "warmup_steps": warmup, "acceptance": curve})
        print(json.dumps(results[-1]), flush=True)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "replay.json").write_text(json.dumps({"args": vars(args), "results": results}, indent=2))
    start = results[0]["acceptance"][0]
    header = " | ".join(f"step {k}" for k in range(1, args.steps + 1))
    lines = [
        "# The online head's first steps, replayed at KL 0",
        "",
        f"Produced by `.venv/bin/python scripts/online_head_replay.py --configs {args.configs} --steps {args.steps} "
        f"--objective {args.objective}` on this CPU (float32). Starting head: `{shown(args.checkpoint)}`; "
        f"{args.minis} x {args.responses_per_mini} of the starting policy's own responses per step; the expected "
        f"acceptance of a sampled draft over {len(held_out)} held-out responses of other prompts "
        f"(start {start:.4f}), and its change from the start:",
        "",
        f"| learning rate | warm-up steps | {header} |",
        "|---|---|" + "---|" * args.steps,
    ]
    for r in results:
        cells = " | ".join(f"{a:.4f} ({(a / start - 1) * 100:+.1f}%)" for a in r["acceptance"][1:])
        lines.append(f"| {r['lr']:g} | {r['warmup_steps']} | {cells} |")
    plot(results, out / "replay.png")
    lines += ["", "![replay](replay.png)"]
    (out / "README.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
