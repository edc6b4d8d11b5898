#!/usr/bin/env bash
# Line coverage of the test suite, Python subprocesses included (.coveragerc: patch = subprocess).
#
#   bash scripts/coverage.sh              # the default run (-m 'not slow') -> results/coverage.md
#   bash scripts/coverage.sh tests/test_env.py   # any pytest arguments (report still written)
#
# The data files go to a scratch folder; the exit status is pytest's.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${VENV:-$ROOT/.venv}
REPORT=${COVERAGE_REPORT:-$ROOT/results/coverage.md}
DATA=$(mktemp -d "${TMPDIR:-/tmp}/specsched-coverage.XXXXXX")
cd "$ROOT"
export COVERAGE_FILE=$DATA/.coverage COVERAGE_RCFILE=$ROOT/.coveragerc
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} MKL_NUM_THREADS=${MKL_NUM_THREADS:-1} WANDB_MODE=disabled WANDB_SILENT=true MPLBACKEND=Agg
start=$(date +%s)
nice -n 10 "$VENV/bin/coverage" run -m pytest -q -p no:cacheprovider "$@"
status=$?
elapsed=$(( $(date +%s) - start ))
"$VENV/bin/coverage" combine -q "$DATA" || exit 1
"$VENV/bin/python" "$ROOT/scripts/coverage_report.py" --data "$COVERAGE_FILE" --rcfile "$COVERAGE_RCFILE" \
    --command "bash scripts/coverage.sh${1:+ $*}" --pytest-status "$status" --elapsed-s "$elapsed" --out "$REPORT" || exit 1
rm -rf "$DATA"
exit "$status"
