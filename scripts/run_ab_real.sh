#!/usr/bin/env bash
# The real model's A/B (results/real/ab/): DAPO on SmolLM2-135M-Instruct with its MTP head (+experiment=smollm2;
# the head ships in recipe/heads/), 16 steps per mode: seed 0 every mode, then seed 1 the modes the seed spread
# is read from (spec off's two seeds are also the A/A control of the decode speed). The modes take turns every 8 steps
# (a multiple of test_freq and save_freq, so the turns add no evaluation or checkpoint); keep the machine otherwise
# idle: the tables compare wall-clock times. About 6 hours on 2 cores. Rerunning resumes a killed mode and skips
# finished ones; `--report-only` rebuilds the tables.
#   scripts/run_ab_real.sh [extra Hydra overrides]
set -euo pipefail
cd "$(dirname "$0")/.."
common=(--name smollm2 --out results/real/ab --chunk-steps 8 +experiment=smollm2 trainer.total_training_steps=16
    trainer.save_freq=4 trainer.test_freq=8 trainer.val_before_train=false trainer.max_actor_ckpt_to_keep=1
    recipe.progress_bar=false)
.venv/bin/python -m recipe.ab --seeds 0 --modes off,sam,mtp_frozen,mtp_online,hybrid "${common[@]}" "$@"
.venv/bin/python -m recipe.ab --seeds 1 --modes off,hybrid,mtp_online "${common[@]}" "$@"
