"""veRL plugin entry point (``verl.plugins``): veRL imports it in every process that imports ``verl`` and ignores
what it returns, so the import itself registers the CPU platform and, with ``VERL_PLATFORM=cpu``, applies its
patches (recipe/verl_cpu.py), and in a job the recipe launched makes veRL's file logger mark each step
(recipe/dapo/step_marks.py) and its trainer keep the servers' drafter memory with its checkpoints
(recipe/dapo/verl_drafter_state.py). A module of its own, because vLLM's plugin loader imports recipe.verl_cpu in
processes that may import veRL only later."""

import logging
import os

from recipe.dapo.step_marks import mark_logged_steps
from recipe.dapo.verl_drafter_state import keep_drafter_state_with_checkpoints
from recipe.verl_cpu import register

try:  # veRL logs a plugin's import error at debug level only: say it loudly, a CPU run cannot work without it
    register()
    mark_logged_steps()
    keep_drafter_state_with_checkpoints()
except Exception:
    logging.getLogger(__name__).exception("spec-rollout: veRL plugin failed in pid %d", os.getpid())
    raise
