#!/usr/bin/env bash
# Mutation testing of the core modules (mutmut 3; configuration in setup.cfg [mutmut]).
#
#   bash scripts/mutation.sh                      # the core set below -> results/mutation.md
#   bash scripts/mutation.sh 'envs.outcome.*'     # only some mutants (mutmut name globs)
#
# Core set: the cost model and exact check (envs/feasibility.py), the outcome model
# (envs/outcome.py), the env's action handling (action_index, action_indices and both step()s
# of envs/edge_schedule.py), the per-mode solver, BALANCE and the optimum (agents/).
# Runs in a scratch copy of the committed tree (MUTATION_SOURCE=worktree copies the work tree
# instead), so concurrent edits never mix in; the copy is kept for `mutmut show NAME` there, and
# a rerun only re-tests mutants of functions that changed. Slow (tens of minutes on 2 cores):
# not part of the default test run -- run it on demand and before a release.
#
# Environment: MUTATION_JOBS (parallel mutants, default 2), MUTATION_WORKDIR (scratch folder,
# default $TMPDIR/specsched-mutation), MUTATION_REPORT (default results/mutation.md).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${VENV:-$ROOT/.venv}
WORK=${MUTATION_WORKDIR:-${TMPDIR:-/tmp}/specsched-mutation}
JOBS=${MUTATION_JOBS:-2}
SOURCE=${MUTATION_SOURCE:-head}
REPORT=${MUTATION_REPORT:-$ROOT/results/mutation.md}
DEFAULT_TARGETS=(
    'envs.feasibility.*'
    'envs.outcome.*'
    'envs.edge_schedule.x_action_index__mutmut_*'
    'envs.edge_schedule.x_action_indices__mutmut_*'
    'envs.edge_schedule.xǁEdgeScheduleEnvǁstep__mutmut_*'
    'envs.edge_schedule.xǁEdgeScheduleVectorEnvǁstep__mutmut_*'
    'agents.mode_solver.*'
    'agents.balance.*'
    'agents.optimal.*'
)
if [ $# -gt 0 ]; then TARGETS=("$@"); else TARGETS=("${DEFAULT_TARGETS[@]}"); fi
[ -x "$VENV/bin/mutmut" ] || { echo "mutmut not installed: $VENV/bin/pip install -e '.[dev]'" >&2; exit 2; }

# refresh the scratch copy's sources, keep its mutants/ (mutmut's cache of results)
mkdir -p "$WORK"
find "$WORK" -mindepth 1 -maxdepth 1 ! -name mutants -exec rm -rf {} +
if [ "$SOURCE" = head ]; then
    git -C "$ROOT" archive HEAD | tar -x -C "$WORK"
else
    (cd "$ROOT" && git ls-files -co --exclude-standard -z | tar --null -T - -cf -) | tar -x -C "$WORK"
fi
cd "$WORK"
echo "mutation testing in $WORK (source: $SOURCE @ $(git -C "$ROOT" rev-parse --short HEAD)), $JOBS jobs" >&2
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 WANDB_MODE=disabled
nice -n 10 "$VENV/bin/mutmut" run --max-children "$JOBS" "${TARGETS[@]}" > "$WORK/mutmut-run.log" 2>&1 || {
    echo "mutmut run failed; see $WORK/mutmut-run.log" >&2; tail -n 20 "$WORK/mutmut-run.log" >&2; exit 1; }
"$VENV/bin/python" "$ROOT/scripts/mutation_report.py" \
    --equivalents "$ROOT/scripts/mutation_equivalents.tsv" \
    --targets "${TARGETS[@]}" \
    --command "bash scripts/mutation.sh${1:+ $*}" \
    --out "$REPORT"
