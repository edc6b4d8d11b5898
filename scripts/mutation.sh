#!/usr/bin/env bash
# Mutation testing of the core modules (mutmut 3; base configuration in setup.cfg [mutmut]).
#
#   bash scripts/mutation.sh                 # every group below -> results/mutation.md
#   bash scripts/mutation.sh envs            # one group (the report covers the groups run)
#   MUTATION_RERUN=survivors bash scripts/mutation.sh envs   # after adding tests: re-run survivors only
#
# Groups (each in its own scratch folder, with the tests that exercise it; a mutant runs only the
# tests that reach the mutated function):
#   envs   -- the cost model, exact check and builders (envs/{cost_model,feasibility,plan_builder}.py), the outcome model
#             (envs/outcome.py), the env's action handling (envs/actions.py: action_index,
#             action_indices; both step()s of envs/edge_schedule.py, the v0 scalar and vector envs;
#             the envs.edge_schedule.x_action_index* globs match runs from before actions.py existed);
#   agents -- the per-mode solver, BALANCE and the optimum (agents/mode_solver.py, balance.py, optimal.py,
#             exact_search.py: the exhaustive search, moved out of optimal.py);
#   split  -- SpecEdge's model (#13): the closed form (envs/{split_cost,split_cohorts,draft_tree}.py), ED in the
#             round model, its builder and outcome (envs/{split_plan,split_builder,split_outcome,scalar_times}.py)
#             and the v1 schedulers (agents/{balance_ed,edge_first,ed_batch}.py).
# Runs on a scratch copy of the committed tree (MUTATION_SOURCE=worktree copies the work tree
# instead), so concurrent edits never mix in; the copy is kept for `mutmut show NAME` there.
# Slow (tens of minutes on 2 shared cores): not part of the default test run -- run it on demand and
# before a release.
#
# Environment: MUTATION_JOBS (parallel mutants, default 2), MUTATION_WORKDIR (scratch root, default
# $TMPDIR/specsched-mutation), MUTATION_REPORT (default results/mutation.md), MUTATION_HISTORY (text
# added to the report's first line: how the groups' runs came about, e.g. a first run and a rerun).
# MUTATION_RERUN=survivors: refresh only tests/ in the group's scratch copy and its test selection
# (setup.cfg's list, TESTS below; the code stays that of its last run, so its verdicts stand; mutmut first runs the tests on that unmutated code
# and stops if they fail, e.g. tests written for code that changed since) and re-run only its
# surviving mutants. MUTATION_RERUN_TESTS="tests/a.py tests/b.py" refreshes only those files
# (for when other tests at HEAD need code newer than the run's). MUTATION_RERUN=report: run nothing, rewrite the report from
# the groups' last runs (e.g. `MUTATION_RERUN=report bash scripts/mutation.sh envs agents`).
# MUTATION_CARRY_KILLED="split": in the report, that group's mutants a survivors-only rerun left unchecked count as
# killed (they were, in its last full run; only valid while its modules have not changed since; the report says so).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${VENV:-$ROOT/.venv}
WORK=${MUTATION_WORKDIR:-${TMPDIR:-/tmp}/specsched-mutation}
JOBS=${MUTATION_JOBS:-2}
SOURCE=${MUTATION_SOURCE:-head}
REPORT=${MUTATION_REPORT:-$ROOT/results/mutation.md}

declare -A FILES TESTS GLOBS TIMEOUT
# a mutant is stopped after (selected tests' time + 1 s) x multiplier x 2 CPU seconds (mutmut's
# rule); the agents group's time-limited searches (certify, exhaustive_search) turn into endless
# loops under some mutants, so its multiplier is 2 instead of mutmut's 15
TIMEOUT[envs]=15
TIMEOUT[agents]=2
FILES[envs]="envs/cost_model.py envs/feasibility.py envs/plan_builder.py envs/outcome.py envs/actions.py envs/edge_schedule.py"
TESTS[envs]="tests/test_golden.py tests/test_binding.py tests/test_env_actions.py tests/test_feasibility.py tests/test_env.py tests/test_fidelity.py tests/test_plan_builder_mutants.py tests/test_cost_model_mutants.py tests/test_outcome_mutants.py"
GLOBS[envs]="envs.cost_model.* envs.feasibility.* envs.plan_builder.* envs.outcome.* envs.actions.* envs.edge_schedule.x_action_index__mutmut_* envs.edge_schedule.x_action_indices__mutmut_* envs.edge_schedule.xǁEdgeScheduleEnvǁstep__mutmut_* envs.edge_schedule.xǁEdgeScheduleVectorEnvǁstep__mutmut_*"
FILES[agents]="agents/mode_solver.py agents/balance.py agents/optimal.py agents/exact_search.py"
# the agents group runs only fast tests with exact expected values (brute force on tiny rounds,
# hand-walked rounds); the slower hypothesis / brute-force suites (test_mode_solver.py,
# test_schedulers.py, test_optimal.py) stay in the default run, out of the per-mutant selection
TESTS[agents]="tests/test_agents_core.py tests/test_golden.py tests/test_binding.py tests/test_balance_mutants.py tests/test_mode_solver_mutants.py tests/test_exact_search_mutants.py tests/test_optimal_mutants.py tests/test_build_table_mutants.py tests/test_sort_ties.py"
GLOBS[agents]="agents.mode_solver.* agents.balance.* agents.optimal.* agents.exact_search.*"
TIMEOUT[split]=15
FILES[split]="envs/split_cost.py envs/split_cohorts.py envs/draft_tree.py envs/split_plan.py envs/split_builder.py envs/split_outcome.py envs/scalar_times.py agents/balance_ed.py agents/edge_first.py agents/ed_batch.py"
# the fast tests with exact expected values: hand-derived formulas, brute force on small rounds, the
# recorded v1 trajectories, builder == exact check; the DES and the live runtime's tests stay out
TESTS[split]="tests/test_split_cost.py tests/test_split_plan.py tests/test_split_outcome.py tests/test_env_v1_golden.py tests/test_env_v1_speed_paths.py tests/test_env_v1_fast_paths.py tests/test_v1_reset_batch.py tests/test_specedge_schedulers.py tests/test_split_workload.py tests/test_split_cost_mutants.py tests/test_split_builder_mutants.py tests/test_split_plan_mutants.py tests/test_specedge_schedulers_mutants.py tests/test_sort_ties.py"
GLOBS[split]="envs.split_cost.* envs.split_cohorts.* envs.draft_tree.* envs.split_plan.* envs.split_builder.* envs.split_outcome.* envs.scalar_times.* agents.balance_ed.* agents.edge_first.* agents.ed_batch.*"

SELECTED=("$@")
[ ${#SELECTED[@]} -gt 0 ] || SELECTED=(envs agents split)
for g in "${SELECTED[@]}"; do
    [ -n "${FILES[$g]:-}" ] || { echo "unknown group '$g'; groups: envs agents split" >&2; exit 2; }
done
[ -x "$VENV/bin/mutmut" ] || { echo "mutmut not installed: $VENV/bin/pip install -e '.[dev]'" >&2; exit 2; }
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 WANDB_MODE=disabled

snapshot() {  # the committed tree (or the work tree), optionally only some paths, as a tar stream
    if [ "$SOURCE" = head ]; then
        git -C "$ROOT" archive HEAD "$@"
    else
        (cd "$ROOT" && git ls-files -co --exclude-standard -z "$@" | tar --null -T - -cf -)
    fi
}

group_config() {  # setup.cfg [mutmut] with this group's files, tests and timeout multiplier
    "$VENV/bin/python" - "$1" "$2" "$3" <<'PY'
import configparser, sys
cfg = configparser.ConfigParser()
cfg.read("setup.cfg")
cfg["mutmut"]["only_mutate"] = "\n" + "\n".join(sys.argv[1].split())
cfg["mutmut"]["pytest_add_cli_args_test_selection"] = "\n" + "\n".join(sys.argv[2].split())
cfg["mutmut"]["timeout_multiplier"] = sys.argv[3]
with open("setup.cfg", "w") as fh:
    cfg.write(fh)
PY
}

survivors() {  # surviving mutants among the globs, one per line
    "$VENV/bin/python" - "$@" <<'PY'
import fnmatch, subprocess, sys
from pathlib import Path
out = subprocess.run([str(Path(sys.executable).with_name("mutmut")), "results"], capture_output=True, text=True, check=True).stdout
for line in out.splitlines():
    name, _, status = line.strip().partition(": ")
    if status in ("survived", "no tests") and any(fnmatch.fnmatch(name, t) for t in sys.argv[1:]):
        print(name)
PY
}

DIRS=()
ALL_GLOBS=()
for g in "${SELECTED[@]}"; do
    dir="$WORK/$g"
    read -r -a globs <<< "${GLOBS[$g]}"
    mkdir -p "$dir"
    if [ "${MUTATION_RERUN:-}" = report ]; then
        [ -d "$dir/mutants" ] || { echo "no previous run in $dir" >&2; exit 2; }
        run=()
    elif [ "${MUTATION_RERUN:-}" = survivors ]; then
        [ -d "$dir/mutants" ] || { echo "no previous run in $dir" >&2; exit 2; }
        read -r -a refresh <<< "${MUTATION_RERUN_TESTS:-tests}"
        for t in "${refresh[@]}"; do rm -rf "${dir:?}/$t" "$dir/mutants/$t"; done
        snapshot "${refresh[@]}" | tar -x -C "$dir"
        for t in "${refresh[@]}"; do mkdir -p "$(dirname "$dir/mutants/$t")"; cp -r "$dir/$t" "$dir/mutants/$t"; done
        cd "$dir"
        # the group's current test selection (new test files are then collected, and mutmut
        # gathers which functions they reach before re-running the survivors)
        group_config "${FILES[$g]}" "${TESTS[$g]}" "${TIMEOUT[$g]}"
        mapfile -t run < <(survivors "${globs[@]}")
        echo "[$g] re-running ${#run[@]} surviving mutants with the current tests" >&2
    else
        # refresh the scratch copy's sources, keep its mutants/ (mutmut's cache of results)
        find "$dir" -mindepth 1 -maxdepth 1 ! -name mutants -exec rm -rf {} +
        snapshot | tar -x -C "$dir"
        cd "$dir"
        group_config "${FILES[$g]}" "${TESTS[$g]}" "${TIMEOUT[$g]}"
        run=("${globs[@]}")
    fi
    [ "${MUTATION_RERUN:-}" = report ] || echo "[$g] mutation testing in $dir (source: $SOURCE @ $(git -C "$ROOT" rev-parse --short HEAD)), $JOBS jobs" >&2
    if [ ${#run[@]} -gt 0 ]; then
        nice -n 10 "$VENV/bin/mutmut" run --max-children "$JOBS" "${run[@]}" > "$dir/mutmut-run.log" 2>&1 || {
            echo "mutmut run failed; see $dir/mutmut-run.log" >&2; tail -n 20 "$dir/mutmut-run.log" >&2; exit 1; }
    fi
    DIRS+=("$dir")
    ALL_GLOBS+=("${globs[@]}")
done
cd "$ROOT"
CARRY=()
for g in ${MUTATION_CARRY_KILLED:-}; do CARRY+=("$WORK/$g"); done
"$VENV/bin/python" "$ROOT/scripts/mutation_report.py" --workdirs "${DIRS[@]}" \
    --carry-killed "${CARRY[@]}" \
    --equivalents "$ROOT/scripts/mutation_equivalents.tsv" \
    --targets "${ALL_GLOBS[@]}" \
    --command "${MUTATION_RERUN:+MUTATION_RERUN=$MUTATION_RERUN }${MUTATION_CARRY_KILLED:+MUTATION_CARRY_KILLED=$MUTATION_CARRY_KILLED }bash scripts/mutation.sh${1:+ $*}" \
    --history "${MUTATION_HISTORY:-}" \
    --out "$REPORT"
