"""MiMo MTP: the model (model.py), its loss and masks (loss.py), checkpoints, conversion, and online training on
veRL's FSDP actor (verl_fsdp.py)."""

MTP_LR_KEY = "mtp_lr"  # the MTP layer's learning rate among veRL's optimizer extra arguments
# (actor_rollout_ref.actor.optim.override_optimizer_config), where the recipe puts spec.mtp.lr for verl_fsdp.py
MTP_LOSS_FRACTION_KEY = "mtp_loss_sequence_fraction"  # spec.mtp.loss_sequence_fraction as an attribute of the actor's
# HF config (actor_rollout_ref.model.override_config), where verl_fsdp.py's model reads it
MTP_OBJECTIVE_KEY = "mtp_loss_objective"  # spec.mtp.objective, carried to verl_fsdp.py's model the same way
MTP_OBJECTIVES = ("sampled", "distill", "acceptance")  # spec.mtp.objective's values: what the online loss matches
# (mtp/loss.py); every one but sampled reads the policy's own distribution of the drafted token
