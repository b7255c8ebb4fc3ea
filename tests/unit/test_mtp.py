"""Online MTP training: mask conventions, gradient isolation, packing, CP zigzag roll, checkpoint converters,
and the engine's drafter receiving the trained head."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mtp.convert import megatron_to_mimo, mimo_to_megatron
from mtp.cp import padded_cu_seqlens, roll_zigzag, zigzag_merge, zigzag_split
from mtp.loss import masked_ce, mtp_targets, next_token_targets, roll_packed
from mtp.model import MiMoConfig, MiMoForCausalLM


def packed(lengths: list[int]) -> torch.Tensor:
    cu = torch.zeros(len(lengths) + 1, dtype=torch.long)
    cu[1:] = torch.tensor(lengths).cumsum(0)
    return cu


def oracle_mtp_mask(response_mask: torch.Tensor, cu: torch.Tensor, depth: int) -> torch.Tensor:
    """Brute force: position t trains MTP depth k iff tokens t+1 .. t+2+k exist in t's sequence and are all
    response tokens (the input token t+1+k and the target t+2+k, and everything in between)."""
    out = torch.zeros_like(response_mask)
    for j in range(len(cu) - 1):
        lo, hi = int(cu[j]), int(cu[j + 1])
        for t in range(lo, hi):
            ahead = range(t + 1, t + 3 + depth)
            out[t] = int(all(a < hi and response_mask[a] == 1 for a in ahead))
    return out


def slime_label_aligned_double_roll(response_mask: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:
    """A reading of slime's MTP loss code (THUDM/slime, megatron_utils' MTP path): a label-aligned mask (L[j] covers
    predicting token j+1) rolled once before the MTP loop and once inside it, i.e. L[t+2] = m[t+3]."""
    label_aligned = roll_packed(response_mask, cu, -1)
    return roll_packed(roll_packed(label_aligned, cu, -1), cu, -1)


def test_blog_example_mask():
    """The slime blog: loss mask [1,0,1,1,0] gives MTP mask [0,1,0,-,-] ('-': no target, never trained)."""
    ids = torch.tensor([10, 11, 12, 13, 14])
    m = torch.tensor([1, 0, 1, 1, 0])
    targets, mask = mtp_targets(ids, m, packed([5]))
    assert mask.tolist() == [0, 1, 0, 0, 0]
    assert targets[1] == 13  # position 1 reads token 2 (embedding) and predicts token 3


@pytest.mark.parametrize("depth", [0, 1])
def test_mtp_mask_matches_the_definition_on_packed_multi_turn_masks(depth):
    gen = torch.Generator().manual_seed(depth)
    lengths = [1, 2, 7, 13, 30, 5]
    cu = packed(lengths)
    for _ in range(20):
        m = (torch.rand(int(cu[-1]), generator=gen) < 0.7).long()  # holes = tool/observation tokens
        ids = torch.randint(0, 100, (int(cu[-1]),), generator=gen)
        targets, mask = mtp_targets(ids, m, cu, depth=depth)
        assert mask.tolist() == oracle_mtp_mask(m, cu, depth).tolist()
        for t in torch.nonzero(mask).flatten().tolist():
            assert targets[t] == ids[t + 2 + depth]


def test_the_mask_check_catches_the_slime_off_by_one():
    """The same oracle rejects the label-aligned double roll (so the check above can fail)."""
    cu = packed([6, 9])
    m = torch.tensor([0, 0, 1, 1, 1, 1] + [0, 0, 0, 1, 1, 1, 1, 1, 1])
    ours = mtp_targets(torch.arange(15), m, cu)[1]
    shifted = slime_label_aligned_double_roll(m, cu)
    assert ours.tolist() == oracle_mtp_mask(m, cu, 0).tolist()
    assert shifted.tolist() != oracle_mtp_mask(m, cu, 0).tolist()
    # concretely, in sequence 1 (prompt of 2, response of 4 ending in EOS at token 5): the double roll trains
    # position 0, which reads a prompt token, and never trains position 3, the one that predicts EOS
    assert ours[:6].tolist() == [0, 1, 1, 1, 0, 0]
    assert shifted[:6].tolist() == [1, 1, 1, 0, 0, 0]


def test_prompt_response_boundary_and_eos():
    """Prompt of P tokens, response of R tokens ending in EOS, followed by another packed sequence: MTP
    trains at positions P-1 .. P+R-3 exactly; the first reads the first response token, the last predicts EOS;
    nothing targets a token of the next sequence."""
    eos = 99
    p_len, r_len = 4, 6
    seq1 = [1, 2, 3, 4] + [20, 21, 22, 23, 24, eos]
    seq2 = [5, 6, 30, 31, eos]
    ids = torch.tensor(seq1 + seq2)
    m = torch.tensor([0] * p_len + [1] * r_len + [0, 0, 1, 1, 1])
    cu = packed([len(seq1), len(seq2)])
    targets, mask = mtp_targets(ids, m, cu)
    trained = torch.nonzero(mask[: len(seq1)]).flatten().tolist()
    assert trained == list(range(p_len - 1, p_len + r_len - 2))
    assert targets[trained[-1]] == eos
    assert ids[trained[0] + 1] == seq1[p_len]  # reads the first response token
    assert mask[len(seq1) - 2 :].tolist()[:2] == [0, 0]  # the last two slots of seq 1 have no target in seq 1
    nt_targets, nt_mask = next_token_targets(ids, m, cu)
    assert nt_mask[len(seq1) - 1] == 0 and nt_targets[len(seq1) - 1] == 0  # never predicts seq 2's first token


@pytest.mark.parametrize("shift", [-1, -2, 1])
def test_packed_roll_equals_per_sequence_roll(shift):
    lengths = [3, 1, 8, 5]
    cu = packed(lengths)
    x = torch.arange(1, int(cu[-1]) + 1)
    rolled = roll_packed(x, cu, shift)
    for j in range(len(lengths)):
        seq = x[int(cu[j]) : int(cu[j + 1])]
        ref = torch.roll(seq, shift)
        if shift < 0:
            ref[shift:] = 0  # vacated slots are zero, not wrapped around
        else:
            ref[:shift] = 0
        assert rolled[int(cu[j]) : int(cu[j + 1])].tolist() == ref.tolist()


def tiny_model(tie: bool = False, seed: int = 0, mtp_layers: int = 1, vocab: int = 40) -> MiMoForCausalLM:
    cfg = MiMoConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=tie, num_nextn_predict_layers=mtp_layers,
    )  # fmt: skip
    model = MiMoForCausalLM(cfg)
    model.init_weights(seed, std=0.2)
    return model


@torch.no_grad()
def test_mtp_loss_packed_equals_unpacked():
    model = tiny_model()
    gen = torch.Generator().manual_seed(1)
    lengths = [9, 4, 12]
    cu = packed(lengths)
    ids = torch.randint(0, 40, (int(cu[-1]),), generator=gen)
    m = (torch.rand(int(cu[-1]), generator=gen) < 0.8).long()
    out = model(ids, cu)
    t, mask = mtp_targets(ids, m, cu)
    ce = F.cross_entropy(out.mtp_logits[0], t, reduction="none") * mask
    total = 0.0
    for j in range(len(lengths)):
        sl = slice(int(cu[j]), int(cu[j + 1]))
        single_cu = packed([lengths[j]])
        o = model(ids[sl], single_cu)
        ts, ms = mtp_targets(ids[sl], m[sl], single_cu)
        total += float((F.cross_entropy(o.mtp_logits[0], ts, reduction="none") * ms).sum())
    assert float(ce.sum()) == pytest.approx(total, rel=1e-5)


@pytest.mark.parametrize("share", ["every trained position", "the middle sequence and the tails left out"])
@pytest.mark.parametrize("mtp_layers", [1, 2])
def test_mtp_logits_at_loss_positions_equal_the_full_forward_and_train_the_same(mtp_layers, share):
    """``mtp_positions`` (the trainer runs the head only where its loss trains) returns the full forward's rows
    there, and a loss over them gives the full forward's MTP gradients: attention still reads the prompt positions
    it skips, and a sequence without such positions, or a sequence's rows after its last, change nothing."""
    model = tiny_model(mtp_layers=mtp_layers)
    gen = torch.Generator().manual_seed(4)
    prompt_lens, lengths = [5, 3, 7], [12, 9, 15]
    cu = packed(lengths)
    ids = torch.randint(0, 40, (int(cu[-1]),), generator=gen)
    m = torch.cat([torch.tensor([0] * p + [1] * (n - p)) for p, n in zip(prompt_lens, lengths, strict=True)])
    t, mask = mtp_targets(ids, m, cu)
    positions = mask.nonzero().squeeze(-1)
    if share != "every trained position":
        positions = torch.cat([positions[positions < 8], positions[(positions >= 21) & (positions < 30)]])
    assert 0 < len(positions) < len(ids)

    def mtp_grads(restrict: bool) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        out = model(ids, cu, mtp_positions=positions if restrict else None)
        rows = [x if restrict else x[positions] for x in out.mtp_logits]
        sum(F.cross_entropy(x, t[positions]) for x in rows).backward()
        named = dict(model.named_parameters())
        return [x.detach() for x in rows], {n: named[n].grad.clone() for n in named if "mtp_layers" in n}

    full_rows, full_grads = mtp_grads(restrict=False)
    rows, restricted_grads = mtp_grads(restrict=True)
    for full, restricted in zip(full_rows, rows, strict=True):
        torch.testing.assert_close(restricted, full, rtol=1e-5, atol=1e-6)
    for name, g in full_grads.items():
        torch.testing.assert_close(restricted_grads[name], g, rtol=1e-5, atol=1e-6, msg=name)


def test_the_trainers_mtp_loss_is_the_masked_loss_of_the_full_forward():
    """``forward_rows`` (old log-probs and the update) computes the head only at its loss positions; its loss
    and accuracy equal the masked CE over every position of the same rows."""
    from recipe.dapo.batch import build_batch
    from recipe.dapo.policy import forward_rows, pack_rows
    from recipe.dapo.rollout import Response
    from recipe.data.loader import Problem

    model = tiny_model()
    gen = torch.Generator().manual_seed(5)
    shapes = [(4, 9), (6, 1), (3, 14), (5, 0)]  # (prompt, response) lengths: a 1-token and an empty response
    responses = [
        Response(k, torch.randint(1, 40, (p,), generator=gen).tolist(), torch.randint(1, 40, (r,), generator=gen).tolist(), "", "stop")
        for k, (p, r) in enumerate(shapes)
    ]  # fmt: skip
    problems = [Problem(k, "test", [], "0") for k in range(len(shapes))]
    batch = build_batch(responses, problems, [str(k) for k in range(len(shapes))], 0, 8, 16)
    out = forward_rows(model, batch, 1.0, with_mtp=True, grad=False)
    rows = pack_rows(batch)
    with torch.no_grad():
        full = model(rows.input_ids, rows.cu_seqlens)
    t, mask = mtp_targets(rows.input_ids, rows.response_mask, rows.cu_seqlens)
    loss, acc = masked_ce(full.mtp_logits[0], t, mask)
    assert int(mask.sum()) == 8 + 13
    assert float(out.mtp_loss) == pytest.approx(float(loss), rel=1e-5)
    assert float(out.mtp_acc) == pytest.approx(float(acc), abs=1e-6)


def teacher_one_position_later(model, batch, temperature: float):
    """The whole forward of ``batch``'s packed rows, the MTP targets and mask, the trained positions, and the policy's
    distribution of token t+2 at each (its logits at t+1 over the temperature), computed here apart from the trainer."""
    from recipe.dapo.policy import pack_rows

    rows = pack_rows(batch)
    with torch.no_grad():
        full = model(rows.input_ids, rows.cu_seqlens)
    t, mask = mtp_targets(rows.input_ids, rows.response_mask, rows.cu_seqlens)
    at = mask.nonzero().squeeze(-1)
    return full, t, mask, at, torch.softmax(full.logits[at + 1] / temperature, dim=-1)


def test_the_distill_objective_is_the_ce_against_the_policys_own_distribution_one_position_later():
    """``spec.mtp.objective=distill``: at each trained position t the head's loss is the CE of its distribution at the
    rollout temperature (what vLLM samples a draft from) against the policy's distribution of token t+2 at it (its
    logits at t+1 over T), from the same forward; a one-hot teacher on the sampled token gives back the sampled
    objective's CE (fails for a teacher taken at t, or either side at T=1)."""
    from mtp.loss import mtp_loss
    from recipe.dapo.policy import forward_rows

    model = tiny_model()
    batch = two_group_batch()
    temperature = 0.7
    out = forward_rows(model, batch, temperature, with_mtp=True, grad=False, mtp_objective="distill")
    full, t, mask, at, teacher = teacher_one_position_later(model, batch, temperature)
    expected = -(teacher * F.log_softmax(full.mtp_logits[0][at] / temperature, dim=-1)).sum(-1).mean()
    assert float(out.mtp_loss) == pytest.approx(float(expected), rel=1e-5)
    sampled = forward_rows(model, batch, temperature, with_mtp=True, grad=False, mtp_objective="sampled")
    assert abs(float(sampled.mtp_loss) - float(out.mtp_loss)) > 0.05
    assert float(out.mtp_acc) == pytest.approx(float(sampled.mtp_acc), abs=1e-6)  # both against the sampled token
    one_hot = F.one_hot(t[at], full.logits.shape[-1]).float() * 1e4
    loss, _ = mtp_loss("distill", full.mtp_logits[0][at], t[at], one_hot)
    assert float(loss) == pytest.approx(float(masked_ce(full.mtp_logits[0], t, mask)[0]), rel=1e-5)
    with pytest.raises(ValueError, match="spec.mtp.objective"):
        mtp_loss("kl", full.mtp_logits[0][at], t[at], one_hot)


def test_the_acceptance_objective_is_minus_a_sampled_drafts_chance_of_acceptance_and_raises_it():
    """``spec.mtp.objective=acceptance``: the head's loss is minus the mean of ``sum(min(p, q))`` over the trained
    positions, p the policy's distribution of token t+2 at the rollout temperature (its logits at t+1 over T), q the
    head's at it; written here from the definition, and an SGD step on it raises that acceptance (fails for a teacher
    taken at t, an untempered head, or a sign error)."""
    from recipe.dapo.policy import forward_rows

    model = tiny_model()
    batch = two_group_batch()
    temperature = 0.7
    out = forward_rows(model, batch, temperature, with_mtp=True, grad=True, mtp_objective="acceptance")
    full, _, _, at, p = teacher_one_position_later(model, batch, temperature)
    q = torch.softmax(full.mtp_logits[0][at] / temperature, dim=-1)  # what vLLM samples a draft from
    accepted = torch.stack([torch.minimum(p[i], q[i]).sum() for i in range(len(at))]).mean()
    assert float(out.mtp_loss) == pytest.approx(-float(accepted), rel=1e-5)
    assert 0.0 < float(accepted) < 1.0
    out.mtp_loss.backward()
    with torch.no_grad():
        for param in model.model.mtp_layers.parameters():
            param -= 0.5 * param.grad
        after = forward_rows(model, batch, temperature, with_mtp=True, grad=False, mtp_objective="acceptance")
    assert -float(after.mtp_loss) > float(accepted) + 1e-4


def grads(model: MiMoForCausalLM) -> dict[str, torch.Tensor | None]:
    return {n: (None if p.grad is None else p.grad.clone()) for n, p in model.named_parameters()}


def losses(model, ids, m, cu, detach: bool = True):
    out = model(ids, cu, with_mtp=True, detach_mtp_inputs=detach)
    nt, nm = next_token_targets(ids, m, cu)
    policy = masked_ce(out.logits, nt, nm)[0]  # stands in for the policy loss: any function of the trunk
    t, mask = mtp_targets(ids, m, cu)
    return policy, masked_ce(out.mtp_logits[0], t, mask)[0]


@pytest.mark.parametrize("tie", [False, True])
def test_mtp_loss_updates_only_mtp_parameters(tie):
    model = tiny_model(tie)
    gen = torch.Generator().manual_seed(2)
    cu = packed([10, 14])
    ids = torch.randint(0, 40, (24,), generator=gen)
    m = torch.tensor([0] * 3 + [1] * 7 + [0] * 5 + [1] * 9)
    is_mtp = {n: n.startswith("model.mtp_layers.") for n, _ in model.named_parameters()}

    model.zero_grad(set_to_none=True)
    losses(model, ids, m, cu)[1].backward()
    mtp_only = grads(model)
    for name, g in mtp_only.items():
        if is_mtp[name]:
            assert g is not None and g.abs().sum() > 0, name
        else:
            assert g is None or g.abs().sum() == 0, f"MTP loss reached {name}"

    model.zero_grad(set_to_none=True)
    losses(model, ids, m, cu)[0].backward()
    policy_only = grads(model)
    for name, g in policy_only.items():
        if is_mtp[name]:
            assert g is None or g.abs().sum() == 0, name

    model.zero_grad(set_to_none=True)
    policy, mtp = losses(model, ids, m, cu)
    (policy + 0.2 * mtp).backward()
    for name, g in grads(model).items():
        expected = 0.2 * mtp_only[name] if is_mtp[name] else policy_only[name]
        torch.testing.assert_close(g, expected, rtol=1e-6, atol=1e-7, msg=name)


def test_without_detach_the_mtp_loss_does_reach_the_trunk():
    """Control for the isolation test: the same check fails when inputs are not detached."""
    model = tiny_model()
    cu = packed([12])
    ids = torch.randint(0, 40, (12,), generator=torch.Generator().manual_seed(3))
    losses(model, ids, torch.ones(12, dtype=torch.long), cu, detach=False)[1].backward()
    assert model.model.embed_tokens.weight.grad.abs().sum() > 0
    assert model.lm_head.weight.grad.abs().sum() > 0
    assert model.model.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0


def dapo_actor(model: MiMoForCausalLM, train: str, *overrides: str):
    """The trainer's Actor with the default DAPO config and ``spec=mtp spec.mtp.train=train``."""
    from hydra import compose, initialize_config_dir

    from recipe.dapo.policy import Actor

    configs = str(Path(__file__).resolve().parents[2] / "configs")
    with initialize_config_dir(config_dir=configs, version_base=None):
        cfg = compose(config_name="dapo", overrides=["spec=mtp", f"spec.mtp.train={train}", *overrides])
    return Actor(model, cfg)


def two_group_batch():
    """A DAPO training batch of two groups of two responses with rewards +-1 (two ppo mini-batches under
    UPDATE_OVERRIDES)."""
    from recipe.dapo.batch import build_batch
    from recipe.dapo.rollout import Response
    from recipe.data.loader import Problem

    gen = torch.Generator().manual_seed(11)
    shapes = [(5, 12), (5, 9), (4, 15), (4, 1)]  # (prompt, response) lengths; two groups of two
    responses = [
        Response(k // 2, torch.randint(1, 40, (p,), generator=gen).tolist(), torch.randint(1, 40, (r,), generator=gen).tolist(), "", "stop")
        for k, (p, r) in enumerate(shapes)
    ]  # fmt: skip
    problems = [Problem(k, "test", [], "0") for k in range(2)]
    batch = build_batch(responses, problems, ["0", "1"], 0, 8, 16)
    mask = batch.batch["response_mask"]
    rewards = torch.zeros(mask.shape)
    rewards[torch.arange(4), mask.sum(-1) - 1] = torch.tensor([1.0, -1.0, -1.0, 1.0])
    batch.batch["token_level_rewards"] = rewards
    return batch


UPDATE_OVERRIDES = [
    "actor_rollout_ref.rollout.n=2", "data.train_batch_size=2", "actor_rollout_ref.actor.ppo_mini_batch_size=1",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "actor_rollout_ref.actor.grad_clip=0.01",
    "actor_rollout_ref.actor.optim.lr=1e-5", "actor_rollout_ref.actor.optim.lr_scheduler_type=constant",
]  # fmt: skip


@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("objective", ["sampled", "distill", "acceptance"])
def test_online_mtp_leaves_the_policys_update_exactly_as_a_frozen_head_does(tie, objective):
    """Two DAPO optimizer steps with gradient clipping active: the online head trains, and the policy's
    parameters end bit for bit where the frozen run leaves them (fails if the MTP gradient shares the
    policy's clipping norm, or if any MTP gradient reaches the trunk, embedding or LM head: for ``distill`` and
    ``acceptance`` also through the policy's logits they take as the teacher)."""
    batch = two_group_batch()
    base = tiny_model(tie)
    after, metrics = {}, {}
    for train in ("frozen", "online"):
        actor = dapo_actor(copy.deepcopy(base), train, *UPDATE_OVERRIDES, f"spec.mtp.objective={objective}")
        metrics[train] = actor.update(copy.deepcopy(batch), {})
        after[train] = actor.policy.state_dict()
    before = base.state_dict()
    for name, value in before.items():
        if name.startswith("model.mtp_layers."):
            assert torch.equal(after["frozen"][name], value), name
            assert not torch.equal(after["online"][name], value), name
        else:
            assert not torch.equal(after["frozen"][name], value), name  # the policy trained
            assert torch.equal(after["online"][name], after["frozen"][name]), name
    online = metrics["online"]
    assert online["actor/grad_norm"] > 0.01 and online["mtp/grad_norm"] > 0.01, "both norms above grad_clip"
    assert online["actor/grad_norm"] == metrics["frozen"]["actor/grad_norm"]


def head_step(base: torch.nn.Module, after: dict[str, torch.Tensor]) -> float:
    """The largest move of any MTP head weight from ``base`` to the state ``after`` an update."""
    return max((after[n] - v).abs().max().item() for n, v in base.state_dict().items() if "mtp_layers" in n)


def test_spec_mtp_lr_sets_the_heads_step_and_leaves_the_policys():
    """``spec.mtp.lr``: the MTP layer's own AdamW rate. Two optimizer steps from fresh moments move a parameter by
    about its rate per step (AdamW's first steps are near lr * sign(grad)), so the head moves on the scale of
    spec.mtp.lr (1e-2), a thousand times the actor's 1e-5 it moves without the key, while the policy's parameters
    end exactly where they end without the key (fails if the key is ignored, or if it sets the policy's rate too)."""
    batch = two_group_batch()
    base = tiny_model(False)
    after = {}
    for head_lr in ("null", "0.01"):
        actor = dapo_actor(copy.deepcopy(base), "online", *UPDATE_OVERRIDES, f"spec.mtp.lr={head_lr}")
        actor.update(copy.deepcopy(batch), {})
        after[head_lr] = actor.policy.state_dict()
    moved = {lr: head_step(base, state) for lr, state in after.items()}
    assert 0.5 * 0.01 < moved["0.01"] < 3 * 0.01, moved
    assert 0.5 * 1e-5 < moved["null"] < 3 * 1e-5, moved
    for name, value in after["null"].items():
        if "mtp_layers" not in name:
            assert torch.equal(after["0.01"][name], value), name


def test_the_heads_warm_up_ramps_its_group_alone_on_top_of_verls_schedule():
    """mtp.warm_up_group on veRL's schedules (what both backends build): the head's group runs at (k + 1) / (w + 1) of
    its rate for the first w steps, times the shared schedule, and the trunk's group follows the schedule alone."""
    from omegaconf import OmegaConf

    from mtp import warm_up_group
    from recipe.dapo.policy import verl_lr_scheduler

    trunk, head = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))
    for kind, shared in (("constant", [1.0] * 6), ("cosine", None)):
        optim = OmegaConf.create(
            {"total_training_steps": 6, "lr_warmup_steps": 0, "lr_warmup_steps_ratio": 0.0, "lr_scheduler_type": kind,
             "min_lr_ratio": 0.0, "num_cycles": 0.5, "zero_indexed_step": True}
        )  # fmt: skip
        opt = torch.optim.AdamW([{"params": [trunk]}, {"params": [head], "lr": 1e-2}], lr=1e-3)
        scheduler = verl_lr_scheduler(opt, optim, 6)
        warm_up_group(scheduler, 1, 3)
        trunk_lrs, head_lrs = [], []
        for _ in range(6):
            trunk_lrs.append(opt.param_groups[0]["lr"])
            head_lrs.append(opt.param_groups[1]["lr"])
            opt.step()
            scheduler.step()
        factors = shared or [lr / 1e-3 for lr in trunk_lrs]
        assert trunk_lrs == pytest.approx([1e-3 * f for f in factors])
        ramp = [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
        assert head_lrs == pytest.approx([1e-2 * f * r for f, r in zip(factors, ramp, strict=True)])


def test_spec_mtp_lr_warmup_steps_shrinks_the_heads_first_step_and_leaves_the_policys():
    """On the local trainer a 3-step warm-up makes the head's first update a quarter of spec.mtp.lr's (AdamW's first
    steps scale with the rate), while the policy ends exactly where it ends without the warm-up."""
    batch = two_group_batch()
    base = tiny_model(False)
    after = {}
    for warmup in (0, 3):
        overrides = (*UPDATE_OVERRIDES, "spec.mtp.lr=0.01", f"spec.mtp.lr_warmup_steps={warmup}")
        actor = dapo_actor(copy.deepcopy(base), "online", *overrides)
        actor.update(copy.deepcopy(batch), {})
        after[warmup] = actor.policy.state_dict()
    moved = {w: head_step(base, state) for w, state in after.items()}
    assert 0.2 < moved[3] / moved[0] < 0.3, moved
    for name, value in after[0].items():
        if "mtp_layers" not in name:
            assert torch.equal(after[3][name], value), name


@pytest.mark.parametrize("objective", ["sampled", "distill", "acceptance"])
def test_the_head_only_loss_from_the_rollouts_trunk_states_equals_the_updates_mtp_loss(objective):
    """``head_loss_rows`` (the head trained on rows the policy does not train on, from the trunk states the rollout
    handed over) is the loss and the head gradient of the update's forward on the same rows, its LM head run only at
    the teacher's positions, with no trunk in its graph (fails if the states, the teacher or the targets shift by a
    position, or if the embeddings or the LM head record their activations)."""
    from recipe.dapo.policy import forward_rows, head_loss_rows, own_trunk_states, pack_rows

    model = tiny_model(False)
    batch = own_trunk_states(model, two_group_batch())
    head = [n for n, _ in model.named_parameters() if n.startswith("model.mtp_layers.")]
    results = {}
    for name, run in (
        ("update", lambda: forward_rows(model, batch, 0.7, with_mtp=True, mtp_objective=objective)),
        ("head only", lambda: head_loss_rows(model, batch, 0.7, 1.0, objective)),
    ):
        model.zero_grad(set_to_none=True)
        out = run()
        loss = out.mtp_loss if name == "update" else out[0]
        loss.backward()
        results[name] = (loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if n in head})
    torch.testing.assert_close(results["head only"][0], results["update"][0], rtol=1e-5, atol=1e-6)
    for name, grad in results["update"][1].items():
        torch.testing.assert_close(results["head only"][1][name], grad, rtol=1e-4, atol=1e-6, msg=name)
    rows = pack_rows(batch)
    full = model(rows.input_ids, rows.cu_seqlens, with_mtp=False)
    positions = torch.tensor([3, 7])
    out = model.output_from_states(rows.input_ids, full.hidden.detach(), positions)
    assert not out.embeds.requires_grad and not out.logits.requires_grad
    torch.testing.assert_close(out.logits, full.logits.detach()[positions])


def shared_prompt_batch():
    """Three groups of responses that share their group's prompt (as a DAPO group's do); a one-token response has no
    trained MTP position."""
    from recipe.dapo.batch import build_batch
    from recipe.dapo.rollout import Response
    from recipe.data.loader import Problem

    gen = torch.Generator().manual_seed(5)
    groups = [(6, [7, 1, 4]), (4, [9, 3]), (5, [2, 8, 6])]  # (prompt length, response lengths)
    responses, problems = [], []
    for g, (p_len, r_lens) in enumerate(groups):
        prompt = torch.randint(1, 40, (p_len,), generator=gen).tolist()
        problems.append(Problem(g, "test", [], "0"))
        for r in r_lens:
            responses.append(Response(g, prompt, torch.randint(1, 40, (r,), generator=gen).tolist(), "", "stop"))
    return build_batch(responses, problems, [str(g) for g in range(len(groups))], 0, 8, 16)


@pytest.mark.parametrize("mtp_layers", [1, 2])
def test_mtp_layers_over_a_shared_prompt_once_equal_them_over_every_rows(mtp_layers):
    """The MTP layers run over a prompt its group shares once (``SharedPrompts``) give every row's logits and the
    layers' gradients as running them over each row's own prompt: at every position (a later row's prompt positions
    read the first row's outputs), each row's prompt but the first's then left out of the rows the layers run on, and
    at random halves of the rows' trained positions (where a group's first row may be left out and a later one open
    the prompt). Fails if a row past its prompt's first reads the wrong keys, if the prompt is cut a layer too late,
    or if a position in the prompt reads another row's output."""
    from mtp.loss import sample_sequences
    from mtp.model import mtp_rows
    from recipe.dapo.policy import pack_rows

    model = tiny_model(seed=3, mtp_layers=mtp_layers)
    rows = pack_rows(shared_prompt_batch())
    prompts = rows.shared_prompts()
    assert prompts.first == [0, 0, 0, 3, 3, 5, 5, 5]
    out = model(rows.input_ids, rows.cu_seqlens, with_mtp=False)
    _, trained = mtp_targets(rows.input_ids, rows.response_mask, rows.cu_seqlens, depth=0)
    every = trained.nonzero().squeeze(-1)
    params = [p for n, p in model.named_parameters() if "mtp_layers" in n]
    for seed in range(4):
        torch.manual_seed(seed)
        positions = torch.arange(len(rows.input_ids)) if seed == 0 else sample_sequences(every, rows.cu_seqlens, 0.5)
        results = {}
        for shared in (None, prompts):
            logits = model.draft_logits(out, rows.cu_seqlens, mtp_positions=positions, prompts=shared)
            grads = torch.autograd.grad(sum((x**2).sum() for x in logits), params)
            results[shared is None] = ([x.detach() for x in logits], grads)
        (once, once_grads), (each, each_grads) = results[False], results[True]
        for a, b in zip([*once, *once_grads], [*each, *each_grads], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
        plan, plain = mtp_rows(positions, rows.cu_seqlens, prompts, mtp_layers), mtp_rows(positions, rows.cu_seqlens)
        assert plain.prefixes is None and plan.rows.numel() <= plain.rows.numel()
        if seed == 0:  # the later rows' prompts up to mtp_layers before their ends: 2 x 6 + 1 x 4 + 2 x 5 tokens
            assert plain.rows.numel() - plan.rows.numel() == 26 - 5 * mtp_layers


def test_the_head_only_loss_runs_the_mtp_layer_over_a_shared_prompt_once_with_the_same_loss():
    """``head_loss_rows`` on a DAPO group's rows (a shared prompt, the rollout's states) gives the loss and the head's
    gradient with the prompt run once that it gives with every row's own (``share_prompts=False``)."""
    from recipe.dapo.policy import head_loss_rows, own_trunk_states

    model = tiny_model(seed=4)
    batch = own_trunk_states(model, shared_prompt_batch())
    head = [p for n, p in model.named_parameters() if "mtp_layers" in n]
    results = []
    for share in (True, False):
        loss, _ = head_loss_rows(model, batch, 0.7, 1.0, "acceptance", mtp_vocab_topk=8, share_prompts=share)
        results.append((loss.detach(), torch.autograd.grad(loss, head)))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-5, atol=1e-6)
    for once, each in zip(results[0][1], results[1][1], strict=True):
        torch.testing.assert_close(once, each, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("objective", ["sampled", "acceptance"])
def test_the_head_only_loss_from_the_rollouts_teacher_equals_it_over_the_whole_vocabulary(objective):
    """``head_loss_rows`` on rows that carry the rollout's teacher (its top-k ids and the sampled token's log-prob at
    each response token: shortlist and normaliser, the LM head over the shortlist alone) gives the loss and the head's
    gradient it gives from the LM head over the whole vocabulary, on half the sequences at T=0.7. Fails if the
    teacher is read a position off, if the normaliser ignores the log-prob, or if the shortlist differs (a vocabulary
    of 400 where the responses use 40 tokens, so the shortlist is the top-2's)."""
    from recipe.dapo.policy import head_loss_rows, own_trunk_states

    model = tiny_model(seed=4, vocab=400)
    batch = own_trunk_states(model, shared_prompt_batch(), teacher_topk=2, temperature=0.7)
    without = copy.deepcopy(batch)
    for key in ("teacher_topk", "token_logprobs"):
        without.non_tensor_batch.pop(key)
    head = [p for n, p in model.named_parameters() if "mtp_layers" in n]
    results = []
    for rows in (batch, without):
        torch.manual_seed(11)  # the same half of the sequences
        loss, acc = head_loss_rows(model, rows, 0.7, 0.5, objective, mtp_vocab_topk=2)
        results.append((loss.detach(), acc, torch.autograd.grad(loss, head)))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-5, atol=1e-6)
    assert results[0][1] == results[1][1]
    for rollout, whole in zip(results[0][2], results[1][2], strict=True):
        torch.testing.assert_close(rollout, whole, rtol=1e-4, atol=1e-6)
    with pytest.raises(ValueError, match="top-2 teacher for a top-4 shortlist"):
        head_loss_rows(model, batch, 0.7, 1.0, objective, mtp_vocab_topk=4)


def test_the_head_only_loss_names_rows_without_their_trunk_states():
    """Rows without the rollout's trunk states, or with a count that does not match their tokens, are refused with
    the row named: a state shifted by a position would train the head on the wrong context without an error."""
    from recipe.dapo.policy import head_loss_rows, own_trunk_states

    model = tiny_model(False)
    with pytest.raises(ValueError, match="keep_trunk_states"):
        head_loss_rows(model, two_group_batch(), 0.7, 1.0, "sampled")
    batch = own_trunk_states(model, two_group_batch())
    batch.non_tensor_batch["trunk_states"][2] = batch.non_tensor_batch["trunk_states"][2][1:]
    with pytest.raises(ValueError, match=r"row 2: \d+ trunk states for \d+ tokens"):
        head_loss_rows(model, batch, 0.7, 1.0, "sampled")


def test_a_cap_on_left_out_rows_takes_a_row_of_every_group_before_a_second_of_any():
    """``spec.mtp.dropped_rows_per_step``: the capped rows come one per group first (fails for a plain random draw,
    which would spend the cap on few prompts), are drawn at random within groups, keep the batch's order, and a cap of
    0 or at least the rows keeps every row."""
    from verl import DataProto

    from recipe.dapo.batch import spread_rows

    uids = np.array([g for g in "abcde" for _ in range(8)], dtype=object)
    batch = DataProto.from_dict(tensors={"row": torch.arange(40)}, non_tensors={"uid": uids})
    picks = []
    for seed in range(20):
        rows = spread_rows(batch, np.random.default_rng(seed), max_rows=7)
        groups = list(rows.non_tensor_batch["uid"])
        assert len(rows) == 7 and sorted(set(groups)) == list("abcde"), groups
        assert max(groups.count(g) for g in "abcde") == 2
        assert rows.batch["row"].tolist() == sorted(rows.batch["row"].tolist())
        picks.append(tuple(rows.batch["row"].tolist()))
    assert len(set(picks)) > 10
    for cap in (0, 40, 50):
        assert spread_rows(batch, np.random.default_rng(0), max_rows=cap).batch["row"].tolist() == list(range(40))


def test_a_cap_on_left_out_tokens_takes_the_longest_spread_prefix_within_it():
    """``spec.mtp.dropped_tokens_per_kept_token``: the token cap keeps the longest prefix of the same group-spread draw
    whose response tokens fit (fails if it counts rows, prompt tokens or padding, or if it skips a long row to fit a
    later short one, which would favour short responses); with a row cap as well, the tighter of the two holds."""
    from verl import DataProto

    from recipe.dapo.batch import spread_rows

    uids = np.array([g for g in "abcd" for _ in range(4)], dtype=object)
    lengths = np.array([3, 9, 1, 6, 2, 8, 5, 4, 7, 1, 3, 2, 6, 5, 9, 1])
    mask = torch.zeros(16, 12, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    batch = DataProto.from_dict(
        tensors={"row": torch.arange(16), "response_mask": mask, "attention_mask": torch.ones(16, 20)},
        non_tensors={"uid": uids},
    )
    for seed in range(20):
        drawn = spread_rows(batch, np.random.default_rng(seed)).batch["row"]
        assert drawn.tolist() == list(range(16))  # no cap: every row
        everything = spread_rows(batch, np.random.default_rng(seed), max_rows=16)
        assert everything.batch["row"].tolist() == list(range(16))
        prefix = [
            spread_rows(batch, np.random.default_rng(seed), max_rows=k).batch["row"].tolist() for k in range(1, 17)
        ]
        for budget in (2, 10, 23.5, 40):
            rows = spread_rows(batch, np.random.default_rng(seed), max_tokens=budget).batch["row"].tolist()
            fitting = [[], *(p for p in prefix if lengths[p].sum() <= budget)]
            assert rows == fitting[-1], (seed, budget)
        loose = spread_rows(batch, np.random.default_rng(seed), max_rows=2, max_tokens=1000).batch["row"].tolist()
        assert loose == prefix[1]
        tight = spread_rows(batch, np.random.default_rng(seed), max_rows=12, max_tokens=23.5).batch["row"].tolist()
        assert tight == spread_rows(batch, np.random.default_rng(seed), max_tokens=23.5).batch["row"].tolist()


def test_head_steps_on_left_out_rows_move_the_head_alone_and_leave_the_policys_update():
    """``Actor.train_head`` (``spec.mtp.train_on_dropped_groups``): head-only AdamW steps on rows the update leaves
    out lower the head's loss on them, leave every policy weight and the learning-rate schedule untouched, and the
    policy's update that follows ends bit for bit where it ends without them (fails if the step moves the policy's
    group, or if it consumes the policy's AdamW moments or the schedule)."""
    from recipe.dapo.policy import own_trunk_states

    base = tiny_model(False)
    batch = own_trunk_states(base, two_group_batch())
    overrides = (*UPDATE_OVERRIDES, "spec.mtp.lr=0.01", "spec.mtp.train_on_dropped_groups=true")
    actor = dapo_actor(copy.deepcopy(base), "online", *overrides)
    assert actor.head_trains_on_dropped
    lr = actor.lr_scheduler.get_last_lr()
    timing: dict[str, float] = {}
    losses = [actor.train_head(copy.deepcopy(batch), timing) for _ in range(6)]
    assert losses[0]["mtp/dropped_responses"] == len(batch) and timing["mtp_dropped_groups"] > 0
    assert losses[-1]["mtp/dropped_head_loss"] < losses[0]["mtp/dropped_head_loss"] - 0.05, losses
    assert actor.lr_scheduler.get_last_lr() == lr
    moved = actor.policy.state_dict()
    for name, value in base.state_dict().items():
        assert torch.equal(moved[name], value) != name.startswith("model.mtp_layers."), name
    actor.update(copy.deepcopy(batch), {})
    plain = dapo_actor(copy.deepcopy(base), "online", *UPDATE_OVERRIDES, "spec.mtp.lr=0.01")
    plain.update(copy.deepcopy(batch), {})
    after, expected = actor.policy.state_dict(), plain.policy.state_dict()
    for name, value in expected.items():
        if not name.startswith("model.mtp_layers."):
            assert torch.equal(after[name], value), name


def test_sampled_sequences_keep_all_positions_of_a_random_share_of_the_sequences_with_an_unbiased_mean():
    """``spec.mtp.loss_sequence_fraction``: each draw keeps every position of ceil(fraction * n) of the n sequences
    that hold any, in order (the MTP layer indexes its rows by them), different draws keep different sequences, and
    the token-mean of a per-position value over the kept positions averages to its mean over all (fails for a fixed
    subset such as the first sequences)."""
    from mtp.loss import sample_sequences, sequence_of

    lengths = [20] * 12
    cu = packed(lengths)
    positions = torch.cat([torch.arange(int(cu[i]) + 8, int(cu[i + 1]) - 2) for i in range(12) if i != 5])
    assert torch.equal(sample_sequences(positions, cu, 1.0), positions)
    torch.manual_seed(0)
    draws = [sample_sequences(positions, cu, 0.25) for _ in range(400)]
    for kept in draws[:20]:
        seqs = sequence_of(kept, cu)
        assert seqs.unique().numel() == 3 and 5 not in seqs.tolist()  # ceil(0.25 * 11) of the 11 holding positions
        assert bool((kept[1:] > kept[:-1]).all()) and torch.equal(kept, positions[torch.isin(positions, kept)])
        assert torch.equal(kept, positions[torch.isin(sequence_of(positions, cu), seqs)])  # whole sequences
    assert len({tuple(k.tolist()) for k in draws}) > 100
    value = sequence_of(positions, cu).float() ** 2  # a per-position loss that grows along the stream
    means = [value[torch.searchsorted(positions, kept)].mean().item() for kept in draws]
    assert abs(sum(means) / len(means) - value.mean().item()) < 0.05 * value.mean().item()
    assert sequence_of(sample_sequences(positions, cu, 0.01), cu).unique().numel() == 1


def test_online_mtp_on_a_share_of_the_sequences_trains_the_head_on_fewer_positions():
    """The local trainer's online loss with ``spec.mtp.loss_sequence_fraction=0.5``: the head still trains, its loss
    is computed from half the sequences (a different value), and the policy's update is unchanged."""
    batch = two_group_batch()
    base = tiny_model(False)
    after, metrics = {}, {}
    for fraction in ("1.0", "0.5"):
        torch.manual_seed(0)
        actor = dapo_actor(
            copy.deepcopy(base), "online", *UPDATE_OVERRIDES, f"spec.mtp.loss_sequence_fraction={fraction}"
        )
        metrics[fraction] = actor.update(copy.deepcopy(batch), {})
        after[fraction] = actor.policy.state_dict()
    for name, value in base.state_dict().items():
        if name.startswith("model.mtp_layers."):
            assert not torch.equal(after["0.5"][name], value), name
            assert not torch.equal(after["0.5"][name], after["1.0"][name]), name
        else:
            assert torch.equal(after["0.5"][name], after["1.0"][name]), name
    assert metrics["0.5"]["mtp/loss"] != metrics["1.0"]["mtp/loss"]


def test_draft_vocabulary_is_the_union_of_each_positions_top_k_and_the_sampled_tokens():
    from mtp.loss import draft_vocabulary

    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(6, 50, generator=gen)
    targets = torch.tensor([49, 0, 7, 7, 30, 12])
    vocab = draft_vocabulary(logits, targets, 3)
    expected = {int(t) for t in targets} | {int(i) for row in logits for i in row.argsort(descending=True)[:3]}
    assert vocab.tolist() == sorted(expected)
    assert draft_vocabulary(logits, targets, 500).tolist() == list(range(50))  # k past the vocabulary: all of it


@pytest.mark.parametrize("objective", ["sampled", "distill", "acceptance"])
def test_the_shortlisted_loss_is_the_full_loss_of_a_head_with_no_mass_outside_the_shortlist(objective):
    """``mtp_loss`` over ``vocab`` (the head's logits at those columns, targets and teacher read there) equals, in value
    and gradient, the whole vocabulary's loss of a head whose logits outside ``vocab`` are -inf: the sampled CE and the
    acceptance exactly; the distillation CE is the teacher's mass inside ``vocab`` times the head's log-probs there
    (fails if the targets or the teacher's columns are not remapped to the shortlist's order)."""
    from mtp.loss import draft_vocabulary, mtp_loss

    gen = torch.Generator().manual_seed(5)
    head_full = torch.randn(8, 40, generator=gen)
    teacher = torch.randn(8, 40, generator=gen) * 2
    targets = torch.multinomial(torch.softmax(teacher, -1), 1, generator=gen).squeeze(-1)
    vocab = draft_vocabulary(teacher, targets, 4)
    assert 4 <= vocab.numel() < 40
    short = head_full[:, vocab].clone().requires_grad_(True)
    loss, acc = mtp_loss(objective, short, targets, teacher, vocab)
    masked = torch.full_like(head_full, float("-inf"))
    masked[:, vocab] = short.detach()
    masked.requires_grad_(True)
    if objective == "distill":
        p = torch.softmax(teacher, -1)[:, vocab]
        expected = -(p * torch.log_softmax(masked[:, vocab], -1)).sum(-1).mean()
    else:
        expected, _ = mtp_loss(objective, masked, targets, teacher)
    torch.testing.assert_close(loss, expected)
    loss.backward()
    expected.backward()
    torch.testing.assert_close(short.grad, masked.grad[:, vocab])
    assert acc.item() == (masked.detach().argmax(-1) == targets).float().mean().item()


def test_online_mtp_over_a_vocabulary_shortlist_trains_the_head_and_leaves_the_policys_update():
    """The local trainer's online loss with ``spec.mtp.loss_vocab_topk``: a k past the vocabulary scores every token
    and ends bit for bit where the whole vocabulary's loss does (the shortlist's plumbing changes nothing); a small k
    trains the head to different weights and leaves the policy's update unchanged."""
    batch = two_group_batch()
    base = tiny_model(False)
    after, metrics = {}, {}
    for topk in ("0", "100", "2"):
        actor = dapo_actor(
            copy.deepcopy(base), "online", *UPDATE_OVERRIDES, "spec.mtp.objective=acceptance",
            f"spec.mtp.loss_vocab_topk={topk}",
        )  # fmt: skip
        metrics[topk] = actor.update(copy.deepcopy(batch), {})
        after[topk] = actor.policy.state_dict()
    assert metrics["100"]["mtp/loss"] == metrics["0"]["mtp/loss"] != metrics["2"]["mtp/loss"]
    for name, value in base.state_dict().items():
        assert torch.equal(after["100"][name], after["0"][name]), name
        if name.startswith("model.mtp_layers."):
            assert not torch.equal(after["2"][name], value), name
            assert not torch.equal(after["2"][name], after["0"][name]), name
        else:
            assert torch.equal(after["2"][name], after["0"][name]), name


@pytest.mark.parametrize("cp", [1, 2, 4])
@pytest.mark.parametrize("shift", [-1, -2, -3])
def test_cp_zigzag_roll_equals_the_unsplit_roll(cp, shift):
    lengths = [1, 7, 16, 3, 9]  # odd lengths, shorter than 2*cp, and shorter than the shift
    cu = packed(lengths)
    x = torch.arange(1, int(cu[-1]) + 1)
    shards = zigzag_split(x, cu, cp)
    padded = padded_cu_seqlens(cu, cp)
    assert len(shards) == cp and all(s.shape[0] == int(padded[-1]) // cp for s in shards)
    assert zigzag_merge(shards, cu, cp).tolist() == x.tolist()
    rolled = zigzag_merge(roll_zigzag(shards, cu, cp, shift), cu, cp)
    assert rolled.tolist() == roll_packed(x, cu, shift).tolist()


@pytest.mark.parametrize("cp", [2, 4])
def test_zigzag_rank_r_holds_chunks_r_and_2cp_minus_1_minus_r_of_every_sequence(cp):
    """Oracle for the layout itself (a contiguous split, rank r holding chunks 2r and 2r+1, round-trips through
    its own merge and roll and passes the tests above, but not this one)."""
    lengths = [5, 16, 1]
    cu = packed(lengths)
    x = torch.arange(1, int(cu[-1]) + 1)
    shards = zigzag_split(x, cu, cp)
    for rank in range(cp):
        expected = []
        for j, n in enumerate(lengths):
            seq = x[int(cu[j]) : int(cu[j + 1])].tolist()
            padded_len = -(-n // (2 * cp)) * 2 * cp
            seq += [0] * (padded_len - n)
            size = padded_len // (2 * cp)
            for chunk in (rank, 2 * cp - 1 - rank):
                expected += seq[chunk * size : (chunk + 1) * size]
        assert shards[rank].tolist() == expected, rank


@pytest.mark.parametrize("cp", [2, 4])
def test_cp_mtp_mask_and_targets_equal_unsplit(cp):
    lengths = [5, 11, 2]
    cu = packed(lengths)
    gen = torch.Generator().manual_seed(cp)
    ids = torch.randint(1, 50, (int(cu[-1]),), generator=gen)
    m = (torch.rand(int(cu[-1]), generator=gen) < 0.7).long()
    targets, mask = mtp_targets(ids, m, cu)
    t_cp = zigzag_merge(roll_zigzag(zigzag_split(ids, cu, cp), cu, cp, -2), cu, cp)
    m_shards = zigzag_split(m, cu, cp)
    m1 = roll_zigzag(m_shards, cu, cp, -1)
    m2 = roll_zigzag(m_shards, cu, cp, -2)
    mask_cp = zigzag_merge([a * b for a, b in zip(m1, m2, strict=True)], cu, cp)
    assert t_cp.tolist() == targets.tolist() and mask_cp.tolist() == mask.tolist()


def test_megatron_conversion_round_trips_exactly_and_swaps_the_projection_halves():
    model = tiny_model()
    cfg = model.config
    hf = model.state_dict()
    mc = mimo_to_megatron(hf, cfg)
    assert "mtp.layers.0.eh_proj.weight" in mc and "decoder.layers.1.self_attention.linear_qkv.bias" in mc
    h = cfg.hidden_size
    proj = hf["model.mtp_layers.0.input_proj.weight"]
    assert torch.equal(mc["mtp.layers.0.eh_proj.weight"][:, :h], proj[:, h:])  # Megatron: [embedding | hidden]
    back = megatron_to_mimo(mc, cfg)
    assert set(back) == set(hf)
    for name in hf:
        assert torch.equal(back[name], hf[name]), name
    with pytest.raises(ValueError, match="mtp.layers.1"):
        megatron_to_mimo({**mc, "mtp.layers.1.eh_proj.weight": proj}, cfg)


def rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


@torch.no_grad()
def test_converted_eh_proj_computes_megatrons_mtp_input_from_the_same_hidden_and_embedding():
    """Oracle: Megatron's MTP layer projects ``eh_proj(cat([enorm(embedding), hnorm(hidden)]))``; with the
    converted weights that must equal MiMo's ``input_proj(cat([hidden_layernorm(hidden), token_layernorm(e)]))``
    (a converter that forgets the swap, or maps enorm/hnorm the wrong way, fails here)."""
    model = tiny_model()
    cfg = model.config
    hf = model.state_dict()
    gen = torch.Generator().manual_seed(3)
    for name in ("token_layernorm", "hidden_layernorm"):  # distinct norms, so a swapped mapping shows
        hf[f"model.mtp_layers.0.{name}.weight"] = torch.rand(cfg.hidden_size, generator=gen) + 0.5
    mc = mimo_to_megatron(hf, cfg)
    hidden, embedding = torch.randn(2, 5, cfg.hidden_size, generator=gen)
    eps, pre = cfg.rms_norm_eps, "mtp.layers.0."
    megatron = torch.cat(
        [rms(embedding, mc[pre + "enorm.weight"], eps), rms(hidden, mc[pre + "hnorm.weight"], eps)], -1
    )
    megatron = megatron @ mc[pre + "eh_proj.weight"].T
    layer = model.model.mtp_layers[0]
    layer.load_state_dict({k.removeprefix("model.mtp_layers.0."): v for k, v in hf.items() if ".mtp_layers.0." in k})
    mimo = layer.input_proj(torch.cat([layer.hidden_layernorm(hidden), layer.token_layernorm(embedding)], -1))
    assert torch.allclose(megatron, mimo, atol=1e-5)


@torch.no_grad()
@pytest.mark.parametrize("part", ["weight", "bias"])
def test_fused_qkv_reads_back_as_the_hf_projections_under_megatrons_grouped_split(part):
    """Oracle: Megatron-core's attention views ``linear_qkv``'s output as [.., query groups, (heads per group + 2)
    * head_dim] and splits each group into its query heads, key, value. The fused tensor must give back HF's
    q/k/v projections that way under grouped-query attention (an ungrouped ``[q; k; v]`` fuse round-trips
    through its own split but fails here)."""
    model = tiny_model()
    cfg = model.config
    assert cfg.num_key_value_heads > 1 and cfg.num_attention_heads > cfg.num_key_value_heads
    hf = model.state_dict()
    if part == "bias":  # distinct biases, so a wrong order of the bias shows
        gen = torch.Generator().manual_seed(4)
        hf = {k: torch.randn(v.shape, generator=gen) if k.endswith("_proj.bias") else v for k, v in hf.items()}
    mc = mimo_to_megatron(hf, cfg)
    x = torch.randn(5, cfg.hidden_size)
    pre, out_pre = "model.layers.0.self_attn.", "decoder.layers.0.self_attention.linear_qkv."
    if part == "weight":
        mixed = x @ mc[out_pre + "weight"].T
        want = [x @ hf[f"{pre}{n}_proj.weight"].T for n in "qkv"]
    else:
        mixed = mc[out_pre + "bias"].expand(5, -1)
        want = [hf[f"{pre}{n}_proj.bias"].expand(5, -1) for n in "qkv"]
    groups, hd = cfg.num_key_value_heads, cfg.head_dim
    per = cfg.num_attention_heads // groups
    q, k, v = mixed.view(5, groups, (per + 2) * hd).split([per * hd, hd, hd], dim=-1)
    for got, expected in zip((q, k, v), want, strict=True):
        assert torch.allclose(got.reshape(5, -1), expected, atol=1e-5)


@pytest.mark.parametrize("objective", ["sampled", "acceptance"])
def test_a_deep_online_head_trains_its_chain_and_leaves_the_policys_update(objective):
    """``mtp_depth`` 3 (the head drafts three tokens a step): the policy ends bit for bit where a frozen head leaves it,
    the head moves, and its loss is not the one-token loss (the deeper depths count); at depth 1 the deep loss is the
    one-token loss of the same forward."""
    from recipe.dapo.policy import deep_head_loss, forward_rows, pack_rows

    batch = two_group_batch()
    base = tiny_model(seed=3)
    overrides = (*UPDATE_OVERRIDES, f"spec.mtp.objective={objective}")
    frozen = dapo_actor(copy.deepcopy(base), "frozen", *overrides)
    frozen.update(copy.deepcopy(batch), {})
    deep = dapo_actor(copy.deepcopy(base), "online", *overrides)
    deep.mtp_depth = 3
    metrics = deep.update(copy.deepcopy(batch), {})
    for name, value in deep.policy.state_dict().items():
        if name.startswith("model.mtp_layers."):
            assert not torch.equal(value, base.state_dict()[name]), name
        else:
            assert torch.equal(value, frozen.policy.state_dict()[name]), name
    one = dapo_actor(copy.deepcopy(base), "online", *overrides).update(copy.deepcopy(batch), {})
    assert metrics["mtp/head_loss"] != pytest.approx(one["mtp/head_loss"])
    with torch.no_grad():
        shallow = forward_rows(base, batch, 1.0, with_mtp=True, grad=False, mtp_objective=objective)
        rows = pack_rows(batch)
        out = base(rows.input_ids, rows.cu_seqlens, with_mtp=False)
        _, trained = mtp_targets(rows.input_ids, rows.response_mask, rows.cu_seqlens, depth=0)
        loss, _ = deep_head_loss(base, out, rows, trained.nonzero().squeeze(-1), out.logits, 1.0, objective, 0, 1)
    assert loss.item() == pytest.approx(shallow.mtp_loss.item(), rel=1e-5)
