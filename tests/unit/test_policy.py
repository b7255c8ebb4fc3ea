"""The local actor's DAPO policy loss against the clip-higher definition: which tokens get a gradient."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from mtp.model import MiMoConfig, MiMoForCausalLM

CONFIGS = str(Path(__file__).resolve().parents[2] / "configs")


def actor(*overrides: str):
    from recipe.dapo.policy import Actor

    with initialize_config_dir(config_dir=CONFIGS, version_base=None):
        cfg = compose(config_name="dapo", overrides=list(overrides))
    model = MiMoForCausalLM(MiMoConfig(vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                       num_attention_heads=2, num_key_value_heads=1))  # fmt: skip
    return Actor(model, cfg), cfg.actor_rollout_ref.actor


def clipped_tokens(a, ratios: list[float], advantages: list[float]) -> list[bool]:
    """For one response of tokens with these probability ratios and advantages: which tokens the loss gives no
    gradient (the clipped ones)."""
    log_prob = torch.log(torch.tensor([ratios], dtype=torch.float64)).requires_grad_(True)
    a.actor_cfg.global_batch_info.update(dp_size=1, batch_num_tokens=len(ratios), global_batch_size=1)
    loss, _ = a.policy_loss(
        torch.zeros(1, len(ratios), dtype=torch.float64),
        log_prob,
        torch.tensor([advantages]),
        torch.ones(1, len(ratios)),
    )
    loss.backward()
    return (log_prob.grad[0] == 0).tolist()


@pytest.mark.parametrize("low,high", [(0.2, 0.28), (0.1, 0.5)])
def test_tokens_are_clipped_exactly_outside_one_minus_low_to_one_plus_high(low, high):
    """A positive-advantage token is clipped once its ratio passes 1 + clip_ratio_high, a negative-advantage one
    once it falls under 1 - clip_ratio_low (DAPO's decoupled range); just inside, each keeps its gradient. Fails if
    the two ratios are swapped or one stands for the other."""
    a, cfg = actor(f"actor_rollout_ref.actor.clip_ratio_low={low}", f"actor_rollout_ref.actor.clip_ratio_high={high}")
    eps = 0.01
    ratios = [1 + high - eps, 1 + high + eps, 1 - low + eps, 1 - low - eps]
    assert clipped_tokens(a, ratios, [1.0, 1.0, -1.0, -1.0]) == [False, True, False, True]
    assert (cfg.clip_ratio_low, cfg.clip_ratio_high) == (low, high)


def test_token_mean_weighs_every_token_of_the_batch_alike():
    """Token-mean aggregation: a token's gradient is 1/(tokens in the batch), whichever response holds it (a
    sequence-mean loss would weigh a short response's tokens more)."""
    a, _ = actor()
    a.actor_cfg.global_batch_info.update(dp_size=1, batch_num_tokens=5, global_batch_size=2)
    log_prob = torch.zeros(2, 4, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]])
    loss, _ = a.policy_loss(torch.zeros(2, 4, dtype=torch.float64), log_prob, torch.ones(2, 4), mask)
    loss.backward()
    expected = -mask.double() / 5  # d(-ratio * A)/d log_prob = -1 at ratio 1, A = 1
    assert torch.allclose(log_prob.grad, expected)


@pytest.mark.parametrize(
    "schedule",
    [
        ["actor_rollout_ref.actor.optim.lr_warmup_steps=3"],
        ["actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.25", "actor_rollout_ref.actor.optim.lr_scheduler_type=cosine",
         "actor_rollout_ref.actor.optim.min_lr_ratio=0.1"],
        # an A/B turn: the run stops at step 3 of 8 and keeps the whole run's schedule
        ["actor_rollout_ref.actor.optim.lr_scheduler_type=cosine", "trainer.total_training_steps=3",
         "actor_rollout_ref.actor.optim.total_training_steps=8"],
    ],
)  # fmt: skip
def test_learning_rate_follows_verls_fsdp_schedule_step_by_step(schedule):
    """The local actor's learning rate, training step by training step, is the one veRL's FSDP engine builds from
    the same ``actor.optim`` keys (its ``_build_lr_scheduler``, stepped once per training step by veRL's actor
    worker). Each update here is two optimizer steps (two ppo mini-batches). Fails if warmup or the cosine decay is
    ignored, if the schedule steps per optimizer step, or if a run stopped early ignores ``optim.total_training_steps``
    (an A/B turn would then decay faster than the whole run)."""
    from types import SimpleNamespace

    from omegaconf import OmegaConf
    from test_mtp import UPDATE_OVERRIDES, tiny_model, two_group_batch
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngine

    from recipe.dapo.policy import Actor

    steps = 8
    with initialize_config_dir(config_dir=CONFIGS, version_base=None):
        cfg = compose(config_name="dapo", overrides=[*UPDATE_OVERRIDES, "actor_rollout_ref.actor.optim.lr=1e-3",
                                                     f"trainer.total_training_steps={steps}", *schedule])  # fmt: skip
    a = Actor(tiny_model(), cfg)
    optim = omega_conf_to_dataclass(OmegaConf.merge(cfg.actor_rollout_ref.actor.optim, {"total_training_steps": steps}))
    reference_optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    reference = FSDPEngine._build_lr_scheduler(SimpleNamespace(optimizer_config=optim, rank=1), reference_optimizer)
    batch = two_group_batch()
    ours, verls = [], []
    for _ in range(steps):
        ours.append(a.update(batch[:], {})["actor/lr"])
        verls.append(reference.get_last_lr()[0])
        reference.step()
    assert ours == pytest.approx(verls, abs=0)
    assert len(set(ours)) > 3  # the schedule moves
