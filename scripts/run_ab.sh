#!/usr/bin/env bash
# The committed A/B (results/ab/cpu200/): every speculative mode on the configuration that was the default then
# (python -m recipe.ab --earlier-default: configs/ab/earlier_default.yaml; results/demo, "Before"), 200 steps each, the modes taking turns every 50 steps
# (--chunk-steps) so that the machine's slow and fast spells fall on every mode alike; keep it otherwise
# idle: the tables compare wall-clock times.
#   scripts/run_ab.sh [extra Hydra overrides]      e.g. trainer.total_training_steps=400
# Rerunning resumes a killed mode and skips finished ones; `--report-only` rebuilds the tables.
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python -m recipe.ab --name "${AB_NAME:-cpu200}" --earlier-default --chunk-steps 50 recipe.progress_bar=false "$@"
