"""Online MTP on veRL's FSDP actor (veRL 0.9.1 trains an MTP head only with Megatron).

veRL imports this module in every process that builds the actor's model config, because the recipe names it as
``actor_rollout_ref.model.external_lib`` for ``spec=mtp`` with ``spec.mtp.train=online`` (recipe/dapo/config.py).
Importing it registers :class:`MTPTrainingFSDPEngine` in veRL's ``EngineRegistry`` for the FSDP backends under
this platform's vendor key, which veRL's lookup prefers to the device-wide default engine. The engine:

- loads the checkpoint as :class:`MiMoMTPForCausalLM`: HF's Qwen2 trunk plus the MiMo MTP layers of mtp/model.py
  under the checkpoint's names (``model.mtp_layers.*``), so FSDP shards them, checkpoints save them, and veRL's
  weight sync sends them to the vLLM servers, whose MTP drafter loads them (the plain Qwen2 model drops them);
- adds the MTP loss of the local backend (recipe/dapo/policy.py) to each micro-batch's backward during the
  update: the MTP loss of ``spec.mtp.objective`` (CE of the sampled token, or of the policy's own distribution of
  it from the same forward's logits) at the positions mtp/loss.py's masks train (those of a random share of the
  sequences, ``spec.mtp.loss_sequence_fraction``, which the recipe puts in the HF config), over the vocabulary or,
  with ``spec.mtp.loss_vocab_topk``, a shortlist of it, on detached trunk hidden states, embeddings and LM head,
  scaled by ``actor_rollout_ref.model.mtp.mtp_loss_scaling_factor`` and by the micro-batch's share of the
  mini-batch's response tokens;
- clips the head's gradients apart from the policy's, so the policy's update is the one it would be without the
  head (under one global norm the MTP loss would shrink the policy's step whenever clipping is active);
- gives the head its own learning rate when the recipe sets ``spec.mtp.lr`` (veRL's optimizer config has one
  learning rate; the recipe passes the head's as ``override_optimizer_config.mtp_lr``, taken out here), and its own
  warm-up with ``spec.mtp.lr_warmup_steps`` (``mtp_lr_warmup_steps`` beside it).

With ``mtp.enable_train`` off (a frozen head, the reference model) the engine behaves as veRL's own.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM
from verl.utils.device import get_device_name, get_vendor
from verl.utils.fsdp_utils import fsdp2_clip_grad_norm_
from verl.utils.metric import AggregationType, Metric
from verl.workers.engine.base import EngineRegistry
from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

from mtp import (
    MTP_DEPTH_KEY,
    MTP_LOSS_FRACTION_KEY,
    MTP_LR_KEY,
    MTP_LR_WARMUP_KEY,
    MTP_OBJECTIVE_KEY,
    MTP_VOCAB_TOPK_KEY,
    warm_up_group,
)
from mtp.loss import chain_loss, draft_vocabulary, mtp_loss, mtp_targets, sample_sequences
from mtp.model import (
    MiMoConfig,
    MTPLayer,
    packed_positions,
    rope_cos_sin,
    run_mtp_layers,
    run_mtp_unrolled,
    shared_prompts,
)


class MiMoMTPForCausalLM(Qwen2ForCausalLM):
    """HF Qwen2 with MiMo's MTP layers (``model.mtp_layers``). Given ``mtp_batch`` the forward also computes the
    MTP loss and top-1 accuracy (:attr:`mtp_result`, for the engine's metrics) inside the FSDP root's forward,
    where the head's parameters are gathered, and puts the loss on the logits' backward."""

    def __init__(self, config: Qwen2Config):
        super().__init__(config)
        self.mimo = MiMoConfig.from_hf_dict(config.to_dict())
        self.model.mtp_layers = nn.ModuleList(MTPLayer(self.mimo) for _ in range(self.mimo.num_nextn_predict_layers))
        self.mtp_result: tuple[torch.Tensor, torch.Tensor] | None = None

    def forward(self, *args, mtp_batch: dict[str, torch.Tensor] | None = None, **kwargs):
        if mtp_batch is None:
            return super().forward(*args, **kwargs)
        # the trunk's embeddings and its last hidden states before the final norm (what vLLM's MiMo drafter reads)
        captured: dict[str, torch.Tensor] = {}
        hooks = [
            self.model.embed_tokens.register_forward_hook(lambda m, i, out: captured.__setitem__("embeds", out)),
            self.model.norm.register_forward_pre_hook(lambda m, inputs: captured.__setitem__("hidden", inputs[0])),
        ]
        try:
            out = super().forward(*args, **kwargs)
        finally:
            for hook in hooks:
                hook.remove()
        mask = kwargs.get("attention_mask")
        ids, cu_seqlens = mtp_batch["input_ids"], mtp_batch["cu_seqlens"]
        hidden, embeds = (
            (x[mask.bool()] if mask is not None else x[0, : ids.shape[0]])
            for x in (captured["hidden"], captured["embeds"])
        )  # packed: the padded layout's valid positions, or the packed layout without its tail padding
        head = self.lm_head.weight
        if isinstance(head, DTensor):  # FSDP keeps the LM head sharded outside its own forward
            head = head.full_tensor()
        positions = packed_positions(cu_seqlens, ids.shape[0])
        rope = rope_cos_sin(positions, self.mimo.head_dim, self.mimo.rope_theta)
        targets, trained = mtp_targets(ids, mtp_batch["response_mask"], cu_seqlens, depth=0)
        fraction = float(getattr(self.config, MTP_LOSS_FRACTION_KEY, 1.0))
        at = sample_sequences(trained.nonzero().squeeze(-1), cu_seqlens, fraction)
        objective = str(getattr(self.config, MTP_OBJECTIVE_KEY, "sampled"))
        vocab_topk = int(getattr(self.config, MTP_VOCAB_TOPK_KEY, 0))
        temperature = mtp_batch["temperature"][at + 1, None]  # the rollout's, at the drafted token
        policy_next = vocab = None
        if objective != "sampled" or vocab_topk:
            # the policy's distribution of token t+2: its logits at t+1, at the rollout temperature. Only those rows
            # are gathered: the padded layout's boolean mask would copy every position's [vocabulary] row first. The
            # gather is a copy, so the temperature divides it in place
            rows = at + 1 if mask is None else mask.flatten().nonzero().squeeze(-1)[at + 1]
            policy_next = out.logits.detach().flatten(0, 1)[rows].float().div_(temperature)
        depth = int(getattr(self.config, MTP_DEPTH_KEY, 1))
        if depth > 1:
            head_loss, head_acc = self._chain_loss(
                out, mask, hidden, embeds, head, mtp_batch, at, objective, vocab_topk, depth
            )
            self.mtp_result = (head_loss.detach(), head_acc)
            out.logits = AddLossInBackward.apply(out.logits, head_loss, mtp_batch["loss_weight"])
            return out
        if vocab_topk:
            vocab = draft_vocabulary(policy_next, targets[at], vocab_topk)
            head = head[vocab]
        (logits,) = run_mtp_layers(
            self.model.mtp_layers[:1], hidden, embeds, head, cu_seqlens, positions, rope,
            detach_inputs=True, mtp_positions=at, prompts=shared_prompts(ids, mtp_batch["response_mask"], cu_seqlens),
        )  # fmt: skip
        teacher = policy_next if objective != "sampled" else None
        head_loss, head_acc = mtp_loss(objective, logits / temperature, targets[at], teacher, vocab)
        self.mtp_result = (head_loss.detach(), head_acc)
        # the loss rides on the logits' backward: FSDP gathers the parameters again before the backward of the
        # forward's outputs, and a loss kept aside would run its backward on freed parameter storage
        out.logits = AddLossInBackward.apply(out.logits, head_loss, mtp_batch["loss_weight"])
        return out

    def _chain_loss(self, out, mask, hidden, embeds, head, mtp_batch, at, objective, vocab_topk, depth):
        """:func:`mtp.loss.chain_loss` of a head that drafts ``depth`` tokens a step, its one layer run on its own output
        (:func:`mtp.model.run_mtp_unrolled`) at the anchors ``at``: depth d's teacher is the policy's logits at t+d, at
        the rollout temperature there."""
        ids, cu_seqlens = mtp_batch["input_ids"], mtp_batch["cu_seqlens"]
        last = ids.shape[0] - 1
        ahead = [(at + d).clamp(max=last) for d in range(1, depth + 1)]
        temperatures = [mtp_batch["temperature"][a, None] for a in ahead]
        flat = out.logits.detach().flatten(0, 1)
        stream = None if mask is None else mask.flatten().nonzero().squeeze(-1)
        teachers = [
            flat[a if stream is None else stream[a]].float().div_(t) for a, t in zip(ahead, temperatures, strict=True)
        ]
        labels = [mtp_targets(ids, mtp_batch["response_mask"], cu_seqlens, depth=d) for d in range(depth)]
        vocab = None
        if vocab_topk:
            vocab = draft_vocabulary(torch.cat(teachers), torch.cat([t[at] for t, _ in labels]), vocab_topk)
            head = head[vocab]
        positions = packed_positions(cu_seqlens, ids.shape[0])
        logits = run_mtp_unrolled(
            self.model.mtp_layers[0], hidden, embeds, head, cu_seqlens, positions,
            lambda p: rope_cos_sin(p, self.mimo.head_dim, self.mimo.rope_theta), depth, mtp_positions=at,
        )  # fmt: skip
        teachers = teachers if objective != "sampled" else [None] * depth
        return chain_loss(objective, logits, at, labels, teachers, temperatures, vocab)


class AddLossInBackward(torch.autograd.Function):
    """Identity on ``output``; its backward also backpropagates ``weight * loss`` (as Megatron attaches its MTP
    loss), so the loss is trained by the backward of whatever the caller computes from ``output``."""

    @staticmethod
    def forward(ctx, output: torch.Tensor, loss: torch.Tensor, weight: float) -> torch.Tensor:
        ctx.save_for_backward(loss)
        ctx.weight = weight
        return output.view_as(output)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (loss,) = ctx.saved_tensors
        return grad, torch.full_like(loss, ctx.weight), None


def packed_response_mask(micro_batch) -> torch.Tensor:
    """1 at the response tokens of the micro-batch's packed stream (prompt then response per sequence), as veRL's
    ``no_padding_2_padding`` lays sequences out."""
    prompts, responses, response_mask = micro_batch["prompts"], micro_batch["responses"], micro_batch["response_mask"]
    if prompts.is_nested:
        prompt_lens, response_lens = prompts.offsets().diff(), responses.offsets().diff()
    else:
        attention = micro_batch["attention_mask"]
        prompt_lens = attention[:, : prompts.shape[1]].sum(1)
        response_lens = attention[:, prompts.shape[1] :].sum(1)
    rows = response_mask.unbind() if response_mask.is_nested else list(response_mask)
    parts = []
    for p_len, r_len, row in zip(prompt_lens.tolist(), response_lens.tolist(), rows, strict=True):
        parts += [row.new_zeros(p_len), row[:r_len]]
    return torch.cat(parts)


class MTPTrainingFSDPEngine(FSDPEngineWithLMHead):
    """veRL's FSDP engine with the MTP head trained online (see the module's docstring)."""

    head_warmup_steps = 0  # the head group's own warm-up, from the optimizer's extra arguments (_build_optimizer)

    @property
    def trains_mtp(self) -> bool:
        mtp = getattr(self.model_config, "mtp", None)
        return bool(mtp is not None and mtp.enable and mtp.enable_train and not self.engine_config.forward_only)

    def _build_module(self):
        if not self.trains_mtp:
            return super()._build_module()
        if self.ulysses_sequence_parallel_size > 1:
            raise ValueError(
                "actor_rollout_ref.actor.ulysses_sequence_parallel_size: online MTP on the FSDP actor needs 1 "
                "(the MTP layer reads whole sequences)"
            )
        AutoModelForCausalLM.register(Qwen2Config, MiMoMTPForCausalLM, exist_ok=True)
        try:
            return super()._build_module()
        finally:
            AutoModelForCausalLM.register(Qwen2Config, Qwen2ForCausalLM, exist_ok=True)

    def _model(self, module: nn.Module | None = None) -> MiMoMTPForCausalLM:
        module = self.module if module is None else module
        return getattr(module, "_fsdp_wrapped_module", module)

    def _build_optimizer(self, module):
        """veRL's optimizer; with ``mtp_lr`` among its extra arguments, the MTP layer in a group of that learning
        rate (veRL's scheduler scales every group's rate alike)."""
        from verl.workers.config.optimizer import build_optimizer

        extra = dict(self.optimizer_config.override_optimizer_config or {})
        head_lr = extra.pop(MTP_LR_KEY, None)
        self.head_warmup_steps = int(extra.pop(MTP_LR_WARMUP_KEY, 0))
        if head_lr is None:
            if self.head_warmup_steps:
                raise ValueError(f"{MTP_LR_WARMUP_KEY} is set without {MTP_LR_KEY}: the head has no group of its own")
            return super()._build_optimizer(module)
        config = dataclasses.replace(self.optimizer_config, override_optimizer_config=extra or None)
        layers = getattr(self._model(module).model, "mtp_layers", None)
        head = list(layers.parameters()) if layers is not None else []
        if not head:
            raise ValueError(f"{MTP_LR_KEY}={head_lr} is set but the actor's model has no MTP layer (model.mtp_layers)")
        head_ids = {id(p) for p in head}
        trunk = [p for p in module.parameters() if id(p) not in head_ids]
        return build_optimizer([{"params": trunk}, {"params": head, "lr": float(head_lr)}], config)

    def _build_lr_scheduler(self, optimizer):
        """veRL's schedule, with the head's own warm-up (``mtp_lr_warmup_steps``) on its group."""
        scheduler = super()._build_lr_scheduler(optimizer)
        warm_up_group(scheduler, len(optimizer.param_groups) - 1, self.head_warmup_steps)
        return scheduler

    def _head_parameters(self) -> list[torch.nn.Parameter]:
        return list(self._model().model.mtp_layers.parameters())

    def prepare_model_inputs(self, micro_batch):
        model_inputs, output_args = super().prepare_model_inputs(micro_batch)
        if self.trains_mtp and torch.is_grad_enabled():
            ids = micro_batch["input_ids"]
            mask = micro_batch["response_mask"]
            # token-mean over the mini-batch, as veRL normalises the policy loss (gradients are averaged over ranks)
            tokens = float(mask.values().sum() if mask.is_nested else mask.sum())
            share = tokens * float(micro_batch["dp_size"]) / max(1.0, float(micro_batch["batch_num_tokens"]))
            # the rollout temperature at each packed position (veRL's is a scalar or one per sequence)
            temperature = torch.as_tensor(micro_batch["temperature"], dtype=torch.float32, device=ids.values().device)
            lengths = ids.offsets().diff()
            temperature = temperature.expand(lengths.numel()) if temperature.dim() == 0 else temperature
            model_inputs["mtp_batch"] = {
                "input_ids": ids.values(),
                "temperature": temperature.repeat_interleave(lengths),
                "cu_seqlens": ids.offsets().to(torch.long),
                "response_mask": packed_response_mask(micro_batch).to(ids.values().device),
                "loss_weight": float(self.model_config.mtp.mtp_loss_scaling_factor) * share,
            }
        return model_inputs, output_args

    def forward_step(self, micro_batch, loss_function, forward_only):
        loss, output = super().forward_step(micro_batch, loss_function, forward_only)
        if not self.trains_mtp or forward_only:
            return loss, output
        model = self._model()
        if model.mtp_result is None:
            raise RuntimeError(
                "the actor's forward computed no MTP loss: a veRL forward patch (use_fused_kernels?) replaced "
                "MiMoMTPForCausalLM.forward"
            )
        for name, value in zip(("mtp/loss", "mtp/acc"), model.mtp_result, strict=True):
            output["metrics"][name] = Metric(value=value.item(), aggregation=AggregationType.MEAN)
        model.mtp_result = None
        return loss, output

    def optimizer_step(self):
        """The policy's step as veRL takes it, without the head's gradients in its clipping norm; then the head's
        step, clipped on its own."""
        if not self.trains_mtp:
            return super().optimizer_step()
        head = self._head_parameters()
        grads = [p.grad for p in head]
        for p in head:
            p.grad = None
        grad_norm = super().optimizer_step()
        head_ids = {id(p) for p in head}
        for p in self.module.parameters():
            if id(p) not in head_ids:
                p.grad = None  # already applied; the head's step below must not apply them again
        for p, g in zip(head, grads, strict=True):
            p.grad = g
        head_norm = fsdp2_clip_grad_norm_(head, max_norm=self.optimizer_config.clip_grad)
        if torch.isfinite(head_norm.full_tensor() if hasattr(head_norm, "full_tensor") else head_norm):
            self.optimizer.step()
        return grad_norm


def cpu_actor_engine(
    checkpoint: str,
    train_head: bool,
    loss_scaling_factor: float,
    optimizer,
    loss_sequence_fraction: float = 1.0,
    objective: str = "sampled",
    vocab_topk: int = 0,
    depth: int = 1,
) -> FSDPEngineWithLMHead:
    """veRL's FSDP2 actor engine for ``checkpoint`` built as the veRL backend's CPU actor builds it (fp32, SDPA,
    padded layout), with the MTP head trained online (on ``loss_sequence_fraction`` of the sequences, scored over the
    vocabulary or ``vocab_topk``'s shortlist of it, over a draft chain ``depth`` deep) or not and veRL's
    ``FSDPOptimizerConfig`` ``optimizer``; initialized. For the tests and the overhead benchmark, which run one engine
    in a process of their own."""
    from verl.trainer.config.config import CheckpointConfig
    from verl.workers.config import FSDPEngineConfig, HFModelConfig
    from verl.workers.config.model import MtpConfig

    model = HFModelConfig(
        path=str(checkpoint),
        tokenizer_path=f"{checkpoint}/tokenizer",
        use_remove_padding=False,
        enable_gradient_checkpointing=False,
        override_config={
            "attn_implementation": "sdpa",
            MTP_LOSS_FRACTION_KEY: loss_sequence_fraction,
            MTP_OBJECTIVE_KEY: objective,
            MTP_VOCAB_TOPK_KEY: vocab_topk,
            MTP_DEPTH_KEY: depth,
        },
        external_lib="mtp.verl_fsdp",
        mtp=MtpConfig(
            enable=True, enable_rollout=True, enable_train=train_head, mtp_loss_scaling_factor=loss_scaling_factor
        ),
    )
    engine = EngineRegistry.new(
        model_type="language_model",
        backend="fsdp2",
        model_config=model,
        engine_config=FSDPEngineConfig(
            strategy="fsdp2",
            use_torch_compile=False,
            model_dtype="fp32",
            # computes in float32 as configs/dapo.yaml's fsdp_config.mixed_precision has it (veRL's default: bfloat16)
            mixed_precision={"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"},
        ),
        optimizer_config=optimizer,
        checkpoint_config=CheckpointConfig(),
    )
    engine.initialize()
    return engine


# Python imports a module once per process, so this registers once
EngineRegistry.register(
    model_type="language_model", backend=["fsdp", "fsdp2"], device=get_device_name(), vendor=get_vendor()
)(MTPTrainingFSDPEngine)
