"""MiMo MTP: the model (model.py), its loss and masks (loss.py), checkpoints, conversion, and online training on
veRL's FSDP actor (verl_fsdp.py)."""

MTP_LR_KEY = "mtp_lr"  # the MTP layer's learning rate among veRL's optimizer extra arguments
# (actor_rollout_ref.actor.optim.override_optimizer_config), where the recipe puts spec.mtp.lr for verl_fsdp.py
MTP_LOSS_FRACTION_KEY = "mtp_loss_sequence_fraction"  # spec.mtp.loss_sequence_fraction as an attribute of the actor's
# HF config (actor_rollout_ref.model.override_config), where verl_fsdp.py's model reads it
MTP_OBJECTIVE_KEY = "mtp_loss_objective"  # spec.mtp.objective, carried to verl_fsdp.py's model the same way
MTP_VOCAB_TOPK_KEY = "mtp_loss_vocab_topk"  # spec.mtp.loss_vocab_topk, carried the same way
MTP_DEPTH_KEY = "mtp_loss_depth"  # the head's draft chain its online loss trains (recipe.engine.head_draft_depth),
# carried the same way
MTP_OBJECTIVES = ("sampled", "distill", "acceptance")  # spec.mtp.objective's values: what the online loss matches
# (mtp/loss.py); every one but sampled reads the policy's own distribution of the drafted token
MTP_LR_WARMUP_KEY = "mtp_lr_warmup_steps"  # spec.mtp.lr_warmup_steps, beside MTP_LR_KEY among veRL's optimizer
# extra arguments


def warm_up_group(scheduler, group: int, steps: int) -> None:
    """Ramp one parameter group of ``scheduler``'s optimizer (a ``LambdaLR``, as veRL's schedules are) linearly from
    1/(steps + 1) of its rate to all of it over its first ``steps`` scheduler steps, on top of the schedule every group
    follows: the online MTP head's own warm-up. AdamW's first bias-corrected steps move every weight by about the
    rate whatever its gradient, which costs a converged head acceptance in its first step (results/FINDINGS.md,
    "The head's first AdamW steps")."""
    if steps <= 0:
        return
    shared = scheduler.lr_lambdas[group]

    def ramped(step: int) -> float:
        return shared(step) * min(1.0, (step + 1) / (steps + 1))

    scheduler.lr_lambdas[group] = ramped
    scheduler.optimizer.param_groups[group]["lr"] = scheduler.base_lrs[group] * ramped(scheduler.last_epoch)
