#!/usr/bin/env bash
# The split runtime on a CUDA machine, in one go: load (or build) the pair, check that greedy AD,
# SD and the split are lossless in float16, time the verifier's forward at repeated, new and
# revisited shapes with and without shape bucketing (runtime.split.verify_timing), profile the
# server and edge roles, run a short split benchmark (server on the GPU, edge clients drafting on
# the CPU), and write DIR/results.md (plus lossless.json, verify_timing.{csv,json,md}, profile.yaml,
# split_bench.{csv,md}, baseline.csv). Without CUDA it prints "skipped: no CUDA" and exits 0.
#
#   scripts/gpu_check.sh [--pair PATH] [--out DIR]        (default: the project's full pair, results/gpu_check)
#   PYTHON=python3 scripts/gpu_check.sh ...               (another interpreter than .venv/bin/python)
#   GPU_CHECK_DEVICE=cpu GPU_CHECK_DTYPE=float32 scripts/gpu_check.sh --pair P   (a dry run of the script on CPU)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
PAIR=""
DIR="results/gpu_check"
while [ $# -gt 0 ]; do
  case "$1" in
    --pair) PAIR="$2"; shift 2 ;;
    --out) DIR="$2"; shift 2 ;;
    *) echo "unknown argument $1 (use --pair PATH, --out DIR)" >&2; exit 2 ;;
  esac
done
DEVICE=${GPU_CHECK_DEVICE:-cuda}
DTYPE=${GPU_CHECK_DTYPE:-float16}
if [ "$DEVICE" = cuda ] && ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "skipped: no CUDA"
  exit 0
fi
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$DIR"
if [ -z "$PAIR" ]; then
  PAIR=$("$PY" -c "from runtime.pair import build_pair; print(build_pair(recipe='full'))")
fi
DEV=(--device "$DEVICE" --dtype "$DTYPE")
START=$(date +%s)
echo "== lossless: greedy AD vs SD vs split ($DEVICE, $DTYPE)"
LOSSLESS=0
"$PY" -m runtime.split.lossless_check --pair "$PAIR" "${DEV[@]}" --out "$DIR/lossless.json" | tee "$DIR/lossless.txt" || LOSSLESS=$?
FAILED=""  # steps that failed; the others still run, and results.md names these
step() {  # step NAME COMMAND...: run one step, note a failure, go on
  local name=$1; shift
  echo "== $name"
  "$@" || { echo "!! $name failed (exit $?)"; FAILED="$FAILED $name"; }
}
step verify_timing "$PY" -m runtime.split.verify_timing --pair "$PAIR" "${DEV[@]}" --batches 1,4,8 --buckets 1,64 --cudnn-attention on,off --out "$DIR"
# the edge drafts on the CPU: with the edge process on the same GPU, the first H200 run saw 50-67 ms per verification batch (time-sharing)
step split_bench "$PY" -m experiments.split_bench --pair "$PAIR" "${DEV[@]}" --edge-device cpu --edge-dtype float32 --out "$DIR/split_bench" --rtt-ms 5 \
  --proactive on,off --cohorts 1,2 --clients "${GPU_CHECK_CLIENTS:-8}" --requests 2 --max-new-tokens 48 --window-ms "${GPU_CHECK_WINDOW_MS:-5}" --timeout-s 120
cp "$DIR/split_bench/split_bench.csv" "$DIR/split_bench/split_bench_runs.csv" "$DIR/split_bench/split_bench.md" "$DIR/split_bench/baseline.csv" "$DIR/split_bench/baseline_sweeps.csv" "$DIR/" 2>/dev/null || true
step profile_server "$PY" -m runtime.profile --pair "$PAIR" "${DEV[@]}" --role server --b 1,4,16 --q 1,5,9,64 --c 64,256,1024 --repeats 3 --no-engine --out "$DIR/profile.yaml"
step profile_edge "$PY" -m runtime.profile --pair "$PAIR" "${DEV[@]}" --role edge --b 1 --q 1,2,5,64 --c 64,256,1024 --repeats 3 --out "$DIR/profile.yaml"
GPU=$("$PY" -c "import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'CPU')")
{
  echo "# gpu_check: the split runtime on $GPU ($DEVICE, $DTYPE)"
  echo
  echo "Pair: $PAIR; torch $("$PY" -c 'import torch; print(torch.__version__)'); $(date -u +%Y-%m-%dT%H:%MZ); $(( $(date +%s) - START )) s."
  echo
  echo "Steps that failed: ${FAILED:-none}."
  echo
  echo "## Lossless (exit status $LOSSLESS; 0 = passed)"
  echo
  sed 's/^/    /' "$DIR/lossless.txt"
  echo
  echo "## Verifier forward (ms per verify call; runtime.split.verify_timing)"
  echo
  echo "repeat: one shape every call; growing: the past grows 8 tokens a call (new shapes); revisit: the growing shapes again; cudnn_attention: whether attention may use cuDNN (the verifier keeps it off on CUDA)."
  echo
  cat "$DIR/verify_timing.md" 2>/dev/null || true
  echo
  echo "## Profile"
  echo
  echo "Server and edge roles measured into profile.yaml (sections latency, edge)."
  echo
  grep '^Server throughput' "$DIR/split_bench.md" 2>/dev/null || true
  echo
  sed -n '/## Targets/,$p' "$DIR/split_bench.md" 2>/dev/null || true
} > "$DIR/results.md"
echo "wrote $DIR/results.md"
cat "$DIR/results.md"
[ -z "$FAILED" ] || exit 1
exit "$LOSSLESS"
