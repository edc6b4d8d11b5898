#!/usr/bin/env bash
# Create (or update) the project's virtual environment in .venv with every pinned dependency.
# Idempotent: a second run only re-checks. torch is locked at 2.13.0: the CPU wheel on this kind of machine
# (torch==2.13.0); on a CUDA machine the same pin installs the CUDA build from PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
"$PY" -c 'import sys; assert sys.version_info[:2] == (3, 11), f"SpecSched needs Python 3.11, found {sys.version.split()[0]}"'
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv with $("$PY" --version)"
  "$PY" -m venv .venv
fi
stamp=.venv/.specsched-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ requirements.lock -nt "$stamp" ]; then
  echo "[setup] installing the locked dependencies (first time: a few minutes)"
  .venv/bin/python -m pip install --quiet --upgrade pip
  # Every extra, at the exact versions of requirements.lock (a lean `pip install .` needs only the
  # environment's four dependencies; see pyproject.toml).
  .venv/bin/python -m pip install --quiet --progress-bar off -c requirements.lock -e ".[all,dev]"
  touch "$stamp"
fi
.venv/bin/python -c 'import torch, gymnasium, stable_baselines3, sb3_contrib, hydra, envs, agents; print(f"[setup] ok: torch {torch.__version__}, gymnasium {gymnasium.__version__}, sb3 {stable_baselines3.__version__}")'
