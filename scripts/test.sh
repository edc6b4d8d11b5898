#!/usr/bin/env bash
# Set up the environment and run the test suite (slow tests excluded; add `-m slow` for those).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export WANDB_MODE=disabled WANDB_SILENT=true MPLBACKEND=Agg
exec .venv/bin/python -m pytest "$@"
