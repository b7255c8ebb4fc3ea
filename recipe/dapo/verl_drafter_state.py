"""The drafter's memory in veRL's checkpoints: what SAM learned across rollouts (per-prompt histories, match-band
chances, the step-cost fit) and what the hybrid learned of its head live in the vLLM servers, where veRL's trainer
never looks, so a resumed cluster run would explore again from nothing. With the recipe's launcher (its step-marks
variable set), veRL's trainer here also saves each server's drafter memory into the checkpoint it writes
(``global_step_<N>/drafter/server<i>.pkl``) and loads it back into the servers after resuming from one.

The servers are reached through veRL's own ``collective_rpc`` on each server actor, which runs a function in the
engine's workers (recipe/dapo/rollout.py: ``save_drafter_state_on_worker``, ``load_drafter_state_on_worker``) and
returns nothing, so the workers read and write the files themselves. Server ``i`` of a relaunch loads server ``i``'s
memory: the prompt-affinity router sends a prompt to the same server index again.
"""

from __future__ import annotations

import os
from pathlib import Path

from recipe.dapo.step_marks import STEP_MARKS_ENV

DRAFTER_DIR = "drafter"  # inside veRL's global_step_<N>/


def drafter_paths(checkpoint_dir: str | Path, step: int, servers: int) -> list[str]:
    """Where each server's drafter memory goes in the checkpoint of ``step`` under ``checkpoint_dir``."""
    folder = Path(checkpoint_dir) / f"global_step_{step}" / DRAFTER_DIR
    return [str(folder / f"server{i}.pkl") for i in range(servers)]


def _each_server(trainer, function, step: int) -> None:
    import ray

    servers = [s for replica in trainer.llm_server_manager.get_replicas() for s in replica.servers]
    paths = drafter_paths(trainer.config.trainer.default_local_dir, step, len(servers))
    ray.get([s.collective_rpc.remote(function, args=(p,)) for s, p in zip(servers, paths, strict=True)])


def keep_drafter_state_with_checkpoints() -> None:
    """Make veRL's trainer save the servers' drafter memory with each checkpoint and load it on resume (module
    docstring). Called by the veRL plugin in every veRL process; a no-op outside the recipe's jobs, idempotent."""
    if not os.environ.get(STEP_MARKS_ENV):
        return
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    save, load = PPOTrainer._save_checkpoint, PPOTrainer._load_checkpoint
    if getattr(save, "_spec_rollout_drafter", False):
        return

    def _save_checkpoint(self) -> None:
        from recipe.dapo.rollout import save_drafter_state_on_worker

        save(self)
        _each_server(self, save_drafter_state_on_worker, self.global_steps)

    def _load_checkpoint(self):
        from recipe.dapo.rollout import load_drafter_state_on_worker

        out = load(self)
        if self.global_steps > 0:  # resumed from a checkpoint
            _each_server(self, load_drafter_state_on_worker, self.global_steps)
        return out

    _save_checkpoint._spec_rollout_drafter = True
    PPOTrainer._save_checkpoint, PPOTrainer._load_checkpoint = _save_checkpoint, _load_checkpoint
