#!/usr/bin/env bash
# The committed A/B (results/ab/): every speculative mode the recipe offers on the configuration of the embedded A/Bs
# (python -m recipe.ab --earlier-default: configs/ab/earlier_default.yaml), 200 steps each, the modes taking turns
# every 50 steps (--chunk-steps) so that the machine's slow and fast spells fall on every mode alike; keep it otherwise
# idle: the tables compare wall-clock times.
#   scripts/run_ab.sh [extra Hydra overrides]      e.g. trainer.total_training_steps=400
# Rerunning resumes a killed mode and skips finished ones; `--report-only` rebuilds the tables.
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python -m recipe.ab --name "${AB_NAME:-embedded}" --out "${AB_OUT:-results/ab}" --earlier-default \
    --chunk-steps 50 --modes off,ngram,suffix,sam,mtp_frozen,mtp_online recipe.progress_bar=false "$@"
