#!/usr/bin/env bash
# Rewrite requirements.lock from the project's virtual environment (after scripts/setup.sh and any
# deliberate upgrade): every installed distribution at its exact version, the project itself left
# out. Local version labels (torch's "+cpu") are dropped, so the same lock installs the CPU wheel
# here and the CUDA build on a GPU machine (PEP 440: "==2.13.0" matches "2.13.0+cpu").
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp requirements.lock.XXXXXX)
trap 'rm -f "$tmp"' EXIT
{
  echo "# Exact versions installed by scripts/setup.sh and CI (pip install -c requirements.lock -e \".[all,dev]\")."
  echo "# Regenerate after changing a dependency: bash scripts/lock.sh"
  .venv/bin/python -m pip freeze --exclude-editable --all | grep -v -E '^(specsched|pip|setuptools|wheel)==' | sed -E 's/\+[A-Za-z0-9.]+$//' | LC_ALL=C sort -f
} > "$tmp"
mv "$tmp" requirements.lock
trap - EXIT
echo "[lock] wrote requirements.lock ($(grep -vc '^#' requirements.lock) pins)"
