"""Training-time overhead of online MTP over a frozen head, side by side in one run -> ``results/mtp/``.

Times the policy update of a DAPO step exactly as the local trainer runs it (``recipe.dapo.policy.Actor``:
old log-probs, GRPO advantage, DAPO policy loss over ppo mini-batches, AdamW) with ``spec=mtp`` and
``spec.mtp.train=frozen`` (the head's loss and accuracy are logged from the no-grad old-log-prob forward) or
``online`` (+ 0.2 x MTP CE on detached inputs in the training forward), alternating on the same batch of
task traces. Repeated for deeper trunks of the same width: the MTP layer's share of the work is about one
decoder layer over the trunk's layers, which is why slime sees ~3.5% on deep models (MiMo-7B: 36 layers).

    .venv/bin/python scripts/bench_mtp_overhead.py [--layers 4,16,36 --reps 12]
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))


def make_batch(ckpt: Path, prompts: int, n: int, width: int):
    """A veRL batch of ``prompts`` x ``n`` reference traces of the task (real lengths, real tokens)."""
    from mtp.checkpoint import load_tokenizer
    from recipe.dapo.batch import build_batch
    from recipe.dapo.rollout import Response
    from recipe.data.loader import load_problems
    from recipe.sft.train import encode_prompt

    tok = load_tokenizer(ckpt)
    problems = load_problems(ckpt.parent / "data" / "train.parquet", max_rows=prompts * n)
    responses = []
    for i, p in enumerate(problems):
        ids = tok(p.solution, add_special_tokens=False)["input_ids"][: width - 1] + [tok.eos_token_id]
        responses.append(Response(i, encode_prompt(tok, p.messages), ids, p.solution, "stop"))
    uids = [str(i // n) for i in range(len(problems))]
    return build_batch(responses, problems, uids, tok.pad_token_id, 64, width)


def make_actor(model, train: str, overrides: list[str]):
    """The trainer's Actor for ``model`` with the default DAPO config and ``spec=mtp spec.mtp.train=train``."""
    from hydra import compose, initialize_config_dir

    from recipe.dapo.policy import Actor

    with initialize_config_dir(config_dir=str(REPO_ROOT / "configs"), version_base=None):
        cfg = compose(config_name="dapo", overrides=["spec=mtp", f"spec.mtp.train={train}", *overrides])
    return Actor(model, cfg)


def main() -> None:
    from omegaconf import OmegaConf

    from mtp.checkpoint import load_checkpoint
    from mtp.model import MiMoForCausalLM
    from recipe.sft.train import ensure_base_model

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", default="4,16,32", help="trunk depths (4 = the embedded default)")
    parser.add_argument("--reps", type=int, default=12, help="timed updates per mode and depth")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--micro", type=int, default=16, help="ppo_micro_batch_size_per_gpu (responses)")
    parser.add_argument(
        "--mini", type=int, default=2, help="ppo_mini_batch_size (groups per optimizer step; as configs/dapo.yaml)"
    )
    parser.add_argument("--out", default=str(REPO_ROOT / "results" / "mtp"))
    args = parser.parse_args()

    torch.manual_seed(0)
    ckpt = ensure_base_model(OmegaConf.load(REPO_ROOT / "configs" / "sft.yaml"))
    base = load_checkpoint(ckpt)
    batch = make_batch(ckpt, args.prompts, args.n, 768)
    # an outcome reward of +-1 on the last response token, as veRL's reward manager writes it
    mask = batch.batch["response_mask"]
    last = (mask.sum(-1) - 1).clamp(min=0)
    rewards = torch.zeros(mask.shape)
    rewards[torch.arange(len(batch)), last] = torch.randint(0, 2, (len(batch),)).float() * 2 - 1
    batch.batch["token_level_rewards"] = rewards
    overrides = [f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={args.micro}"]
    overrides += [f"actor_rollout_ref.actor.ppo_mini_batch_size={args.mini}", f"data.train_batch_size={args.prompts}"]
    overrides += [f"actor_rollout_ref.rollout.n={args.n}"]
    rows = []
    for depth in [int(x) for x in args.layers.split(",")]:
        cfg = base.config.__class__(**{**base.config.__dict__, "num_hidden_layers": depth})
        model = MiMoForCausalLM(cfg)
        model.init_weights(0)
        if depth == base.config.num_hidden_layers:
            model.load_state_dict(base.state_dict())
        actors = {mode: make_actor(copy.deepcopy(model), mode, overrides) for mode in ("frozen", "online")}
        times: dict[str, list[float]] = {"frozen": [], "online": []}
        for actor in actors.values():
            actor.update(copy.deepcopy(batch), {})  # warm-up
        for rep in range(args.reps):
            for mode in ("frozen", "online") if rep % 2 == 0 else ("online", "frozen"):
                step_batch = copy.deepcopy(batch)
                t = time.perf_counter()
                actors[mode].update(step_batch, {})
                times[mode].append(time.perf_counter() - t)
        frozen, online = float(np.median(times["frozen"])), float(np.median(times["online"]))
        # each rep runs both modes back to back: the ratio within a rep cancels the machine's slow drift,
        # which moves a 5 s update by more than the MTP layer costs
        paired = 100 * (np.array(times["online"]) / np.array(times["frozen"]) - 1)
        row = {
            "trunk_layers": depth,
            "mtp_layers": cfg.num_nextn_predict_layers,
            "parameters": model.num_parameters(),
            "frozen_update_s": frozen,
            "online_update_s": online,
            "overhead_pct": float(np.median(paired)),
            "overhead_pct_q25": float(np.percentile(paired, 25)),
            "overhead_pct_q75": float(np.percentile(paired, 75)),
            "online_minus_frozen_s": float(np.median(np.array(times["online"]) - np.array(times["frozen"]))),
        }
        rows.append(row)
        print(json.dumps(row))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "overhead.json").write_text(json.dumps(rows, indent=2))
    tokens = int(batch.batch["attention_mask"].sum())
    lines = [
        "# Online MTP training overhead over a frozen head",
        "",
        f"Produced by `.venv/bin/python scripts/bench_mtp_overhead.py --layers {args.layers} --reps {args.reps} "
        f"--mini {args.mini}`: the trainer's policy update (`recipe.dapo.policy.Actor.update`: old log-probs, "
        f"GRPO advantage, DAPO loss, AdamW) over {len(batch)} responses ({tokens} tokens, micro-batch "
        f"{args.micro}, mini-batch {args.mini} groups) on the same batch, {args.reps} reps of both modes back to back "
        "(order alternating); times are medians, the overhead is the median of the per-rep ratios (interquartile "
        "range in brackets); hidden size and MTP layer as the embedded default.",
        "",
        "| trunk layers | parameters | frozen s/update | online s/update | online - frozen (s) | overhead |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['trunk_layers']} | {r['parameters'] / 1e6:.2f}M | {r['frozen_update_s']:.3f} | "
            f"{r['online_update_s']:.3f} | {r['online_minus_frozen_s']:+.3f} | {r['overhead_pct']:+.1f}% "
            f"[{r['overhead_pct_q25']:+.1f}, {r['overhead_pct_q75']:+.1f}] |"
        )
    (out / "README.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
