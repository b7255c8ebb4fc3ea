"""Training-time overhead of online MTP over a frozen head, side by side in one run -> ``results/mtp/``.

Times one DAPO policy update with the MTP head frozen and trained online, alternating on the same batch of task
traces (8 prompts x 8 responses), at several trunk depths of the embedded model's width: the MTP layer's share of
the work is about one decoder layer over the trunk's layers, small on deep models (MiMo-7B: 36 layers). Two backends, each as its trainer runs the update:

- ``local``: ``recipe.dapo.policy.Actor.update`` (old log-probs, GRPO advantage, DAPO loss over ppo
  mini-batches, AdamW); frozen logs the head's loss from the no-grad old-log-prob forward, online adds
  0.2 x MTP CE on detached inputs to the training forward.
- ``verl``: veRL's FSDP2 engine as the veRL backend's actor builds it (``mtp.verl_fsdp``; fp32, SDPA, padded
  layout), the update being one ``engine.train_batch`` with veRL's ``ppo_loss`` per ppo mini-batch, as veRL's
  ``TrainingWorker.train_mini_batch`` runs them; frozen is veRL's own engine (the trunk only), online
  ``MTPTrainingFSDPEngine``. One thread, as veRL's CPU workers run.

    python -m recipe.bench mtp-overhead --backend local|verl [--layers 4,16,36 --reps 12]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from mtp import MTP_OBJECTIVES
from recipe.paths import REPO_ROOT

MODES = ("frozen", "online")
DROPPED_MODE = "online+dropped"  # --dropped-rows: the head also steps on rows the update leaves out


def make_batch(ckpt: Path, prompts: int, n: int, width: int):
    """A veRL batch of ``prompts`` x ``n`` reference traces of the task (real lengths, real tokens), with an outcome
    reward of +-1 on the last response token, as veRL's reward manager writes it."""
    import torch

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
    batch = build_batch(responses, problems, uids, tok.pad_token_id, 64, width)
    mask = batch.batch["response_mask"]
    last = (mask.sum(-1) - 1).clamp(min=0)
    rewards = torch.zeros(mask.shape)
    rewards[torch.arange(len(batch)), last] = torch.randint(0, 2, (len(batch),)).float() * 2 - 1
    batch.batch["token_level_rewards"] = rewards
    return batch


def real_model_batch(ckpt: Path, prompts: int, n: int, response_tokens: int, width: int, samples: Path | None = None):
    """A veRL batch for a real model: ``prompts`` word problems with its chat template, ``n`` responses of
    ``response_tokens`` random token ids each, and an outcome reward of +-1 on the last response token. With
    ``samples`` (a recipe/mtp_head.py sample set) the prompts and responses are the model's own instead, each
    response cut to ``response_tokens`` (shorter ones left out): the update's cost depends on the lengths alone, except
    with ``spec.mtp.loss_vocab_topk``, whose shortlist is as wide as the policy is unsure, far wider on random ids."""
    import torch

    from mtp.checkpoint import load_tokenizer
    from recipe.dapo.batch import build_batch
    from recipe.dapo.rollout import Response
    from recipe.data.loader import load_problems
    from recipe.data.word_problems import write_splits
    from recipe.head_training import load_samples
    from recipe.sft.train import encode_prompt

    tok = load_tokenizer(ckpt)
    problems = [p for p in load_problems(write_splits()[0], max_rows=prompts) for _ in range(n)]
    gen = torch.Generator().manual_seed(0)
    responses = []
    if samples is not None:
        own = [s for s in load_samples(samples)[0] if int(s.response_mask.sum()) >= response_tokens]
        if len(own) < len(problems):
            raise SystemExit(f"{samples}: {len(own)} responses of >= {response_tokens} tokens, {len(problems)} needed")
        for i, s in enumerate(own[: len(problems)]):
            prompt, response = s.ids[s.response_mask == 0], s.ids[s.response_mask == 1]
            responses.append(Response(i, prompt.tolist(), response[:response_tokens].tolist(), "", "length"))
    else:
        for i, p in enumerate(problems):
            ids = torch.randint(100, len(tok), (response_tokens - 1,), generator=gen).tolist() + [tok.eos_token_id]
            responses.append(Response(i, encode_prompt(tok, p.messages), ids, "", "stop"))
    uids = [str(i // n) for i in range(len(problems))]
    batch = build_batch(responses, problems, uids, tok.pad_token_id, 0, width)
    mask = batch.batch["response_mask"]
    rewards = torch.zeros(mask.shape)
    rewards[torch.arange(len(batch)), mask.sum(-1) - 1] = torch.randint(0, 2, (len(batch),), generator=gen) * 2.0 - 1
    batch.batch["token_level_rewards"] = rewards
    return batch


def compose(overrides: list[str]):
    """configs/dapo.yaml with ``overrides``, as ``python -m recipe.dapo`` composes it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(REPO_ROOT / "configs"), version_base=None):
        return hydra_compose(config_name="dapo", overrides=overrides)


def local_updates(model, batch, overrides: list[str], dropped=None) -> dict[str, Callable[[], None]]:
    """One policy update of the local trainer per mode, on a copy of ``batch``; with ``dropped`` (rows carrying their
    trunk states) a third mode, ``DROPPED_MODE``, runs the online head's steps on them before the update, as the
    local trainer does with ``spec.mtp.train_on_dropped_groups``."""
    from recipe.dapo.policy import Actor

    actors = {
        mode: Actor(copy.deepcopy(model), compose(["spec=mtp", f"spec.mtp.train={mode}", *overrides])) for mode in MODES
    }
    updates = {mode: (lambda actor=actor: actor.update(copy.deepcopy(batch), {})) for mode, actor in actors.items()}
    if dropped is not None:
        actor = Actor(
            copy.deepcopy(model),
            compose(["spec=mtp", "spec.mtp.train=online", "spec.mtp.train_on_dropped_groups=true", *overrides]),
        )

        def head_then_update() -> None:
            actor.train_head(dropped, {})
            actor.update(copy.deepcopy(batch), {})

        updates[DROPPED_MODE] = head_then_update
    return updates


def verl_updates(checkpoint: Path, batch, cfg) -> dict[str, Callable[[], None]]:
    """One actor update of veRL's FSDP2 engine per mode: ``train_batch`` per ppo mini-batch of ``batch``."""
    from functools import partial

    import torch
    from tensordict import TensorDict
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage
    from verl.utils import tensordict_utils as tu
    from verl.workers.config import ActorConfig, FSDPOptimizerConfig
    from verl.workers.utils.losses import ppo_loss
    from verl.workers.utils.padding import left_right_2_no_padding

    from mtp.verl_fsdp import cpu_actor_engine

    actor_cfg = cfg.actor_rollout_ref.actor
    n = int(cfg.actor_rollout_ref.rollout.n)
    mini = int(actor_cfg.ppo_mini_batch_size) * n
    micro = int(actor_cfg.ppo_micro_batch_size_per_gpu)
    gen = torch.Generator().manual_seed(0)
    mask = batch.batch["response_mask"]
    old_log_probs = -torch.rand(mask.shape, generator=gen) * 3  # as the rollout policy scored them
    advantages, _ = compute_grpo_outcome_advantage(
        batch.batch["token_level_rewards"], mask, batch.non_tensor_batch["uid"]
    )  # as the local trainer's Actor.update computes it
    keys = ("prompts", "responses", "input_ids", "attention_mask", "position_ids", "response_mask")
    data = TensorDict(
        {
            **{k: batch.batch[k] for k in keys},
            "old_log_probs": old_log_probs,
            "advantages": advantages,
        },
        batch_size=[len(batch)],
    )
    minibatches = []
    for start in range(0, len(batch), mini):
        part = left_right_2_no_padding(data[start : start + mini].clone())
        tu.assign_non_tensor(
            part, temperature=1.0, use_remove_padding=False, use_dynamic_bsz=False, micro_batch_size_per_gpu=micro,
            global_batch_size=mini, calculate_entropy=False, pad_token_id=0,
        )  # fmt: skip
        minibatches.append(part)
    loss = partial(
        ppo_loss,
        ActorConfig(
            strategy="fsdp2", rollout_n=n, ppo_mini_batch_size=int(actor_cfg.ppo_mini_batch_size),
            ppo_micro_batch_size_per_gpu=micro, use_dynamic_bsz=False, clip_ratio_low=actor_cfg.clip_ratio_low,
            clip_ratio_high=actor_cfg.clip_ratio_high, loss_agg_mode=actor_cfg.loss_agg_mode,
        ),
    )  # fmt: skip
    updates = {}
    for mode in MODES:
        engine = cpu_actor_engine(
            checkpoint, mode == "online", float(cfg.spec.mtp.loss_scaling_factor),
            FSDPOptimizerConfig(
                lr=float(actor_cfg.optim.lr), clip_grad=float(actor_cfg.grad_clip), total_training_steps=1000
            ),
            loss_sequence_fraction=float(cfg.spec.mtp.loss_sequence_fraction),
            objective=str(cfg.spec.mtp.objective),
            vocab_topk=int(cfg.spec.mtp.loss_vocab_topk),
        )  # fmt: skip

        def update(engine=engine) -> None:
            with engine.train_mode():
                for part in minibatches:
                    engine.train_batch(part, loss_function=loss)

        updates[mode] = update
    return updates


def deeper_checkpoint(base_ckpt: Path, depth: int, out: Path) -> Path:
    """The base checkpoint with ``depth`` trunk layers (its own weights at its own depth, else random), saved fp32."""
    import torch

    from mtp.checkpoint import load_checkpoint, load_tokenizer, save_checkpoint
    from mtp.model import MiMoForCausalLM

    base = load_checkpoint(base_ckpt)
    if depth == base.config.num_hidden_layers:
        model = base
    else:
        model = MiMoForCausalLM(base.config.__class__(**{**base.config.__dict__, "num_hidden_layers": depth}))
        model.init_weights(0)
    return save_checkpoint(model, load_tokenizer(base_ckpt), out / f"layers{depth}", dtype=torch.float32)


def time_modes(updates: dict[str, Callable[[], None]], reps: int) -> dict[str, list[float]]:
    """``reps`` timed updates per mode after one warm-up each, both modes back to back in alternating order."""
    for update in updates.values():
        update()
    modes = list(updates)
    times: dict[str, list[float]] = {mode: [] for mode in modes}
    for rep in range(reps):
        for mode in modes if rep % 2 == 0 else modes[::-1]:
            t = time.perf_counter()
            updates[mode]()
            times[mode].append(time.perf_counter() - t)
    return times


def summary(depth: int, parameters: int, times: dict[str, list[float]]) -> dict:
    """Medians per mode; the overhead is the median of the per-rep ratios: each rep runs both modes back to back,
    so the ratio within a rep cancels the machine's slow drift, which moves a 5 s update by more than the MTP
    layer costs."""
    online, frozen = np.array(times["online"]), np.array(times["frozen"])
    paired = 100 * (online / frozen - 1)
    row = {
        "trunk_layers": depth,
        "parameters": parameters,
        "frozen_update_s": float(np.median(frozen)),
        "online_update_s": float(np.median(online)),
        "overhead_pct": float(np.median(paired)),
        "overhead_pct_q25": float(np.percentile(paired, 25)),
        "overhead_pct_q75": float(np.percentile(paired, 75)),
        "online_minus_frozen_s": float(np.median(online - frozen)),
    }
    if DROPPED_MODE in times:  # the head's steps on the left-out rows, as a share of the frozen update
        dropped = 100 * (np.array(times[DROPPED_MODE]) - online) / frozen
        row |= {
            "dropped_update_s": float(np.median(times[DROPPED_MODE])),
            "dropped_s": float(np.median(np.array(times[DROPPED_MODE]) - online)),
            "dropped_pct": float(np.median(dropped)),
            "dropped_pct_q25": float(np.percentile(dropped, 25)),
            "dropped_pct_q75": float(np.percentile(dropped, 75)),
        }
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("local", "verl"), default="local", help="whose update is timed")
    parser.add_argument("--layers", default="4,16,36", help="trunk depths (4 = the embedded default)")
    parser.add_argument("--reps", type=int, default=12, help="timed updates per mode and depth")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--micro", type=int, default=16, help="ppo_micro_batch_size_per_gpu (responses)")
    parser.add_argument(
        "--mini", type=int, default=2, help="ppo_mini_batch_size (groups per optimizer step; as configs/dapo.yaml)"
    )
    parser.add_argument(
        "--model",
        help="a real model (a built-in name, .gguf file or HF directory): time it with an untrained MTP layer grafted "
        "on (mtp/graft.py) at its own depth instead of the embedded model at --layers",
    )
    parser.add_argument("--response-tokens", type=int, default=128, help="with --model: tokens per response")
    parser.add_argument(
        "--samples", help="with --model: a recipe/mtp_head.py sample set whose responses replace random ids"
    )
    parser.add_argument(
        "--loss-sequence-fraction", type=float, default=1.0, help="spec.mtp.loss_sequence_fraction of the online mode"
    )
    parser.add_argument(
        "--objective", default="sampled", choices=MTP_OBJECTIVES, help="spec.mtp.objective of the online mode"
    )
    parser.add_argument(
        "--loss-vocab-topk", type=int, default=0, help="spec.mtp.loss_vocab_topk of the online mode (0: every token)"
    )
    parser.add_argument(
        "--dropped-rows",
        type=int,
        default=0,
        help="local backend, with --model: also time the online head's steps on this many rows the update leaves out "
        "(spec.mtp.train_on_dropped_groups), from their trunk states, as a third mode",
    )
    parser.add_argument("--out", default=str(REPO_ROOT / "results" / "mtp"))
    args = parser.parse_args()
    if args.samples and not args.model:
        parser.error("--samples holds a real model's own responses: name that model with --model")
    if args.dropped_rows and (args.backend != "local" or not args.model):
        parser.error("--dropped-rows is the local backend's (veRL's trainer drops the groups), with --model")

    import torch
    from omegaconf import OmegaConf

    from mtp.checkpoint import load_checkpoint
    from recipe.dapo.policy import own_trunk_states
    from recipe.sft.train import ensure_base_model

    if args.backend == "verl":
        from recipe.verl_cpu import PLATFORM_ENV, PLATFORM_NAME, init_single_process_group

        os.environ[PLATFORM_ENV] = PLATFORM_NAME
        torch.set_num_threads(1)  # as veRL's CPU workers run; more crash the CPU backward in a bare process
        init_single_process_group()

    torch.manual_seed(0)
    if args.model:
        from mtp.graft import graft_mtp
        from recipe.models import CACHE_DIR, resolve_model

        base = Path(resolve_model(args.model))
        ckpt = graft_mtp(base, CACHE_DIR / f"{base.name}-mtp-untrained")
        samples = Path(args.samples) if args.samples else None
        extra = -(-args.dropped_rows // args.n)  # whole groups, as dynamic filtering drops them
        batch = real_model_batch(
            ckpt, args.prompts + extra, args.n, args.response_tokens, args.response_tokens, samples
        )
        kept = args.prompts * args.n
        batch, dropped = batch[:kept], batch[kept : kept + args.dropped_rows]
    else:
        ckpt = ensure_base_model(OmegaConf.load(REPO_ROOT / "configs" / "sft.yaml"))
        batch = make_batch(ckpt, args.prompts, args.n, 768)
    overrides = [f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={args.micro}"]
    overrides += [f"actor_rollout_ref.actor.ppo_mini_batch_size={args.mini}", f"data.train_batch_size={args.prompts}"]
    overrides += [
        f"actor_rollout_ref.rollout.n={args.n}",
        f"spec.mtp.loss_sequence_fraction={args.loss_sequence_fraction}",
        f"spec.mtp.objective={args.objective}",
        f"spec.mtp.loss_vocab_topk={args.loss_vocab_topk}",
    ]
    rows = []
    with tempfile.TemporaryDirectory(prefix="mtp-overhead-") as tmp:
        for depth in [None] if args.model else [int(x) for x in args.layers.split(",")]:
            depth_ckpt = ckpt if args.model else deeper_checkpoint(ckpt, depth, Path(tmp))
            model = load_checkpoint(depth_ckpt).float()
            depth = model.config.num_hidden_layers
            if args.backend == "local":
                # with a shortlist the left-out rows carry the rollout's teacher, as generate(teacher_topk=k) hands it
                left_out = own_trunk_states(model, dropped, args.loss_vocab_topk) if args.dropped_rows else None
                updates = local_updates(model, batch, overrides, left_out)
            else:
                updates = verl_updates(depth_ckpt, batch, compose(["spec=mtp", *overrides]))
            row = summary(depth, model.num_parameters(), time_modes(updates, args.reps))
            rows.append(row)
            print(json.dumps(row), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    fraction = f" --loss-sequence-fraction {args.loss_sequence_fraction}" if args.loss_sequence_fraction != 1 else ""
    name = f"overhead_{args.backend}" + (f"_{Path(args.model).name}" if args.model else "")
    name += f"_sequences{args.loss_sequence_fraction}" if fraction else ""
    objective = f" --objective {args.objective}" if args.objective != "sampled" else ""
    name += f"_{args.objective}" if objective else ""
    topk = f" --loss-vocab-topk {args.loss_vocab_topk}" if args.loss_vocab_topk else ""
    name += f"_top{args.loss_vocab_topk}" if topk else ""
    own = f" --samples {args.samples}" if args.samples else ""
    name += "_own_text" if own else ""
    dropped_arg = f" --dropped-rows {args.dropped_rows}" if args.dropped_rows else ""
    name += f"_dropped{args.dropped_rows}" if dropped_arg else ""
    (out / f"{name}.json").write_text(json.dumps(rows, indent=2))
    tokens = int(batch.batch["attention_mask"].sum())
    shape = (
        f"--model {args.model} --response-tokens {args.response_tokens}" if args.model else f"--layers {args.layers}"
    )
    lines = [
        f"Produced by `python -m recipe.bench mtp-overhead --backend {args.backend} {shape} --prompts "
        f"{args.prompts} --n {args.n} --reps {args.reps} --mini {args.mini} --micro {args.micro}{fraction}{objective}{topk}{own}"
        f"{dropped_arg}`: "
        f"{len(batch)} responses ({tokens} tokens, micro-batch {args.micro}, "
        f"mini-batch {args.mini} groups), {args.reps} reps of both modes back to back (order alternating); times are "
        "medians, the overhead is the median of the per-rep ratios (interquartile range in brackets).",
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
    if args.dropped_rows:
        dropped_tokens = int(dropped.batch["attention_mask"].sum())
        lines += [
            "",
            f"The head's steps on {args.dropped_rows} left-out rows ({dropped_tokens} tokens, their trunk states the "
            "policy's own), run before the online update: their time is the median per-rep difference from the online "
            "update, and its share of the frozen update.",
            "",
            "| trunk layers | online + left-out s/update | left-out rows (s) | per row (ms) | share of the frozen update |",
            "|---|---|---|---|---|",
        ]
        for r in rows:
            lines.append(
                f"| {r['trunk_layers']} | {r['dropped_update_s']:.3f} | {r['dropped_s']:+.3f} | "
                f"{1000 * r['dropped_s'] / args.dropped_rows:.0f} | {r['dropped_pct']:+.1f}% "
                f"[{r['dropped_pct_q25']:+.1f}, {r['dropped_pct_q75']:+.1f}] |"
            )
    (out / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
