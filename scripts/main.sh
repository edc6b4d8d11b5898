#!/usr/bin/env bash
# Set up the environment and run the main job on its embedded defaults (see README).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export MPLBACKEND=Agg
exec .venv/bin/python -m experiments.main "$@"
