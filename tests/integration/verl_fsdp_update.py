"""One DAPO update on veRL's FSDP2 engine (the actor's, as the veRL backend builds it), run in a fresh process:
``python tests/integration/verl_fsdp_update.py CHECKPOINT OUT.pt online|frozen [joint] [head_lr=LR] [fraction=F]
[head_warmup=W] [objective=O] [temperature=T] [topk=K] [depth=D]`` saves the parameters
after one update of a fixed batch, with the MTP head trained online or not. ``joint`` clips the head with the policy (the
bug the engine's separate clipping prevents), for the test that this would show; ``head_lr`` gives the head its own
learning rate as the recipe passes ``spec.mtp.lr`` to veRL (the actor's is 1e-2), ``head_warmup`` its warm-up
(``spec.mtp.lr_warmup_steps``); ``fraction`` trains the head on that share
of the sequences (``spec.mtp.loss_sequence_fraction``); ``objective`` is ``spec.mtp.objective``; ``temperature`` the
rollout's (1.0); ``topk`` is ``spec.mtp.loss_vocab_topk``; ``depth`` the head's draft chain the loss trains."""

from __future__ import annotations

import os
import sys

from recipe.verl_cpu import PLATFORM_ENV, PLATFORM_NAME

os.environ[PLATFORM_ENV] = PLATFORM_NAME
os.environ["OMP_NUM_THREADS"] = "1"  # more than one crashes the CPU backward in a bare process (veRL's workers run one)


def batch(tokenizer_pad: int, seed: int = 0):
    """Four left-padded prompts (the last two the same) with right-padded responses, in veRL's trainer layout, as the
    engine receives it."""
    import torch
    from tensordict import TensorDict
    from verl.workers.utils.padding import left_right_2_no_padding

    gen = torch.Generator().manual_seed(seed)
    rows, prompt_len, response_len = 4, 6, 10
    prompts = torch.randint(3, 200, (rows, prompt_len), generator=gen)
    responses = torch.randint(3, 200, (rows, response_len), generator=gen)
    prompt_mask = torch.ones(rows, prompt_len, dtype=torch.long)
    prompt_mask[0, :2] = 0  # left padding
    response_mask = torch.ones(rows, response_len, dtype=torch.long)
    response_mask[1, 7:] = 0  # right padding
    prompts[3] = prompts[2]  # a group's two responses: the MTP layer runs over their prompt once
    prompts[prompt_mask == 0] = tokenizer_pad
    responses[response_mask == 0] = tokenizer_pad
    attention = torch.cat([prompt_mask, response_mask], 1)
    data = TensorDict(
        {
            "prompts": prompts,
            "responses": responses,
            "input_ids": torch.cat([prompts, responses], 1),
            "attention_mask": attention,
            "position_ids": (attention.cumsum(1) - 1).clamp(min=0),
            "response_mask": response_mask,
            "old_log_probs": -torch.rand(rows, response_len, generator=gen) * 3,
            "advantages": torch.randn(rows, 1, generator=gen).expand(rows, response_len).contiguous(),
        },
        batch_size=[rows],
    )
    return left_right_2_no_padding(data)


def main(checkpoint: str, out: str, train: str, *options: str) -> None:
    import torch
    import torch.distributed as dist

    from recipe.verl_cpu import init_single_process_group

    init_single_process_group()

    from functools import partial

    from verl.utils import tensordict_utils as tu
    from verl.workers.config import ActorConfig, FSDPOptimizerConfig
    from verl.workers.utils.losses import ppo_loss

    import mtp.verl_fsdp as verl_fsdp
    from mtp import MTP_LR_KEY, MTP_LR_WARMUP_KEY

    head_lrs = [float(o.removeprefix("head_lr=")) for o in options if o.startswith("head_lr=")]
    fractions = [float(o.removeprefix("fraction=")) for o in options if o.startswith("fraction=")]
    objectives = [o.removeprefix("objective=") for o in options if o.startswith("objective=")]
    temperatures = [float(o.removeprefix("temperature=")) for o in options if o.startswith("temperature=")]
    topks = [int(o.removeprefix("topk=")) for o in options if o.startswith("topk=")]
    depths = [int(o.removeprefix("depth=")) for o in options if o.startswith("depth=")]
    warmups = [int(o.removeprefix("head_warmup=")) for o in options if o.startswith("head_warmup=")]
    extra = {MTP_LR_KEY: head_lrs[-1], **({MTP_LR_WARMUP_KEY: warmups[-1]} if warmups else {})} if head_lrs else None
    if "joint" in options:  # the head's gradients clipped under the policy's norm
        verl_fsdp.MTPTrainingFSDPEngine.optimizer_step = verl_fsdp.FSDPEngineWithLMHead.optimizer_step
    engine = verl_fsdp.cpu_actor_engine(
        checkpoint,
        train == "online",
        0.2,
        # a clip norm that every step reaches, so joint clipping would change the policy's step
        FSDPOptimizerConfig(lr=1e-2, clip_grad=1e-3, total_training_steps=1, override_optimizer_config=extra),
        loss_sequence_fraction=fractions[-1] if fractions else 1.0,
        objective=objectives[-1] if objectives else "sampled",
        vocab_topk=topks[-1] if topks else 0,
        depth=depths[-1] if depths else 1,
    )
    actor = ActorConfig(
        strategy="fsdp2", rollout_n=4, ppo_mini_batch_size=1, ppo_micro_batch_size_per_gpu=2, use_dynamic_bsz=False,
        clip_ratio_low=0.2, clip_ratio_high=0.28, loss_agg_mode="token-mean",
    )  # fmt: skip
    data = batch(tokenizer_pad=0)
    tu.assign_non_tensor(
        data, temperature=temperatures[-1] if temperatures else 1.0, use_remove_padding=False, use_dynamic_bsz=False, micro_batch_size_per_gpu=2,
        global_batch_size=4, calculate_entropy=False, pad_token_id=0,
    )  # fmt: skip
    with engine.train_mode():
        output = engine.train_batch(data, loss_function=partial(ppo_loss, actor))
    metrics = {
        k: float(v.aggregate() if hasattr(v, "aggregate") else v) for k, v in output["metrics"].items() if k != "lr"
    }
    state = {name: p.full_tensor().detach().clone() for name, p in engine.module.named_parameters()}
    torch.save({"params": state, "metrics": metrics}, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
