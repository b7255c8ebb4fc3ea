"""Online MTP on veRL's FSDP2 engine (mtp/verl_fsdp.py): one update of the real engine, in fresh processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[2]


def update(checkpoint: Path, out: Path, *mode: str) -> dict:
    run = subprocess.run(
        [sys.executable, str(REPO / "tests" / "integration" / "verl_fsdp_update.py"), str(checkpoint), str(out), *mode],
        cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return torch.load(out)


def test_the_policy_update_on_verl_fsdp_is_unchanged_by_the_online_head(harness_model, tmp_path):
    """The same batch, one update at a clip norm every step reaches: with the head trained online the trunk, the
    embeddings and the LM head end exactly where they end without it, while the head moves and logs its loss.
    Clipping the head under the policy's norm (the bug the engine's separate clipping prevents) changes them.
    The head's own learning rate and its share of positions change its step and leave the policy's."""
    online = update(harness_model, tmp_path / "online.pt", "online")
    frozen = update(harness_model, tmp_path / "frozen.pt", "frozen")
    joint = update(harness_model, tmp_path / "joint.pt", "online", "joint")
    head_lr = update(harness_model, tmp_path / "head_lr.pt", "online", "head_lr=1e-4")
    warmed = update(harness_model, tmp_path / "warmed.pt", "online", "head_lr=1e-4", "head_warmup=3")
    half = update(harness_model, tmp_path / "half.pt", "online", "fraction=0.5")
    distill = update(harness_model, tmp_path / "distill.pt", "online", "objective=distill", "temperature=0.7")
    shortlist = update(
        harness_model, tmp_path / "shortlist.pt", "online", "objective=distill", "temperature=0.7", "topk=3"
    )
    deep = update(harness_model, tmp_path / "deep.pt", "online", "objective=distill", "temperature=0.7", "depth=3")
    start = load_file(harness_model / "model.safetensors")

    policy = sorted(frozen["params"])
    assert policy and not any("mtp_layers" in name for name in policy)  # veRL's own model holds no head
    for name in policy:
        assert torch.equal(online["params"][name], frozen["params"][name]), name
    assert max((joint["params"][n] - frozen["params"][n]).abs().max().item() for n in policy) > 1e-4

    head = [name for name in online["params"] if "mtp_layers" in name]
    assert sorted(head) == sorted(name for name in start if "mtp_layers" in name)  # the checkpoint's head, loaded
    assert all(not torch.equal(online["params"][n], start[n].float()) for n in head if n.endswith("proj.weight"))
    assert 0 < online["metrics"]["mtp/loss"] < 20 and 0 <= online["metrics"]["mtp/acc"] <= 1
    assert "mtp/loss" not in frozen["metrics"]
    assert online["metrics"]["actor/pg_loss"] == frozen["metrics"]["actor/pg_loss"]

    # spec.mtp.lr (override_optimizer_config.mtp_lr): one AdamW step from fresh moments moves a parameter by about
    # its rate, so the head moves on the scale of 1e-4 instead of the actor's 1e-2, and the policy as without it
    for name in policy:
        assert torch.equal(head_lr["params"][name], online["params"][name]), name
    moved = {
        run: max((r["params"][n] - start[n].float()).abs().max().item() for n in head)
        for run, r in (("actor lr", online), ("head lr", head_lr))
    }
    assert 0.5e-2 < moved["actor lr"] < 2e-2 and 0.5e-4 < moved["head lr"] < 2e-4, moved
    # spec.mtp.lr_warmup_steps (override_optimizer_config.mtp_lr_warmup_steps): the first step at a quarter of that
    # rate after a 3-step warm-up, the policy as without it
    for name in policy:
        assert torch.equal(warmed["params"][name], online["params"][name]), name
    warmed_moved = max((warmed["params"][n] - start[n].float()).abs().max().item() for n in head)
    assert 0.2 < warmed_moved / moved["head lr"] < 0.3, (warmed_moved, moved)

    # spec.mtp.loss_sequence_fraction (the HF config's mtp_loss_sequence_fraction): the head's loss from half the sequences,
    # another value and another step, the policy's unchanged
    for name in policy:
        assert torch.equal(half["params"][name], online["params"][name]), name
    assert 0 < half["metrics"]["mtp/loss"] < 20 and half["metrics"]["mtp/loss"] != online["metrics"]["mtp/loss"]
    assert any(not torch.equal(half["params"][n], online["params"][n]) for n in head)

    # spec.mtp.objective=distill: the engine's MTP loss is the local trainer's (recipe.dapo.policy.forward_rows) on the
    # same rows at the same temperature, the policy's own distribution one position later as the teacher
    assert distill["metrics"]["mtp/loss"] == pytest.approx(local_distill_loss(harness_model, 0.7), rel=1e-4)
    assert abs(distill["metrics"]["mtp/loss"] - online["metrics"]["mtp/loss"]) > 0.01
    # spec.mtp.loss_vocab_topk (the HF config's mtp_loss_vocab_topk): the same loss over the same shortlist as the
    # local trainer's, another value than the whole vocabulary's, the policy's update unchanged
    assert shortlist["metrics"]["mtp/loss"] == pytest.approx(local_distill_loss(harness_model, 0.7, 3), rel=1e-4)
    assert abs(shortlist["metrics"]["mtp/loss"] - distill["metrics"]["mtp/loss"]) > 0.01
    for name in policy:
        assert torch.equal(shortlist["params"][name], distill["params"][name]), name
    # the head's draft chain three deep (the HF config's mtp_loss_depth): the local trainer's chain loss on the same
    # rows, another value than one token's, the policy's update unchanged
    assert deep["metrics"]["mtp/loss"] == pytest.approx(local_distill_loss(harness_model, 0.7, depth=3), rel=1e-4)
    assert abs(deep["metrics"]["mtp/loss"] - distill["metrics"]["mtp/loss"]) > 0.01
    for name in policy:
        assert torch.equal(deep["params"][name], distill["params"][name]), name


def local_distill_loss(checkpoint: Path, temperature: float, vocab_topk: int = 0, depth: int = 1) -> float:
    """The mean over verl_fsdp_update.py's two micro-batches of the distill loss (mtp.loss.mtp_loss, as the local trainer
    computes it, over :func:`mtp.loss.draft_vocabulary` with ``vocab_topk``; over a draft chain ``depth`` deep,
    recipe.dapo.policy.deep_head_loss) of the checkpoint on their rows."""
    sys.path.insert(0, str(REPO / "tests" / "integration"))
    from verl_fsdp_update import batch

    from mtp.checkpoint import load_checkpoint
    from mtp.loss import draft_vocabulary, mtp_loss, mtp_targets

    model = load_checkpoint(checkpoint, torch.float32)
    data = batch(tokenizer_pad=0)
    # each row unpadded (the engine's nested input_ids) and its response length
    rows = [(seq, int(m.sum())) for seq, m in zip(data["input_ids"].unbind(), data["response_mask"], strict=True)]
    losses = []
    for micro in (rows[:2], rows[2:]):
        ids = torch.cat([seq for seq, _ in micro])
        mask = torch.cat([(torch.arange(len(seq)) >= len(seq) - r).long() for seq, r in micro])
        cu = torch.tensor([0] + [len(seq) for seq, _ in micro]).cumsum(0)
        with torch.no_grad():
            out = model(ids, cu)
        targets, trained = mtp_targets(ids, mask, cu)
        at = trained.nonzero().squeeze(-1)
        if depth > 1:
            from recipe.dapo.policy import PackedRows, deep_head_loss

            rows_ = PackedRows(ids, mask, cu, [], [])
            with torch.no_grad():
                loss, _ = deep_head_loss(
                    model, out, rows_, at, out.logits / temperature, temperature, "distill", vocab_topk, depth
                )
            losses.append(float(loss))
            continue
        policy_next = out.logits[at + 1] / temperature
        vocab = draft_vocabulary(policy_next, targets[at], vocab_topk) if vocab_topk else None
        head = out.mtp_logits[0][at] if vocab is None else out.mtp_logits[0][at][:, vocab]
        loss, _ = mtp_loss("distill", head / temperature, targets[at], policy_next, vocab)
        losses.append(float(loss))
    return sum(losses) / len(losses)
