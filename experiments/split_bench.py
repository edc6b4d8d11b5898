"""Split runtime benchmark on one machine over loopback: edge drafting + server verification
(``runtime.edge`` + ``runtime.split_server``, one torch thread per process) against server-only
SD (draft and target batched in one process, one torch thread), across RTTs, proactive drafting
on/off and one or two verification cohorts.

    python -m experiments.split_bench --out results/split_bench                       # the full grid
    python -m experiments.split_bench --out /tmp/sb --rtt-ms 5 --clients 2 --requests 1 --max-new-tokens 16 --preset tiny  # a smoke run

Writes ``DIR/split_bench.csv`` (one row per cell of the grid: the mean of its ``--repeats`` runs),
``DIR/split_bench_runs.csv`` (one row per split run, against the sweeps either side of its
repeat; with ``--baseline``, the given one), ``DIR/baseline.csv`` (the server-only SD sweeps' mean), ``DIR/baseline_sweeps.csv``
(every sweep) and ``DIR/split_bench.md`` (tables and the target checks). Definitions:

- **server throughput** (the headline, ``--throughput``; all three are columns): SpecEdge's point
  is that the server spends its compute only on verification while the edges draft elsewhere, so
  the natural measure is the tokens the server commits per second of the server's own work:
  ``cpu`` (default on CPU): tokens / the server process's CPU seconds while serving (user + sys,
  gRPC and batching included; on one small box the edge processes steal the server's core, so its
  wall-clock rate understates what it would do on a machine of its own); ``busy`` (default on
  CUDA, where the CPU time of a process that waits on the GPU means little): tokens / seconds
  inside verification forwards (synchronised); ``wall``: tokens / the span from the server's
  first batch to its last. Server-only SD does everything on the server, so its ``cpu`` rate is
  tokens / its process CPU seconds and its ``busy`` and ``wall`` rates are tokens / wall time.
- **ITL**: per request, the time from the first iteration's output to the last one's per token
  emitted in between (the first iteration carries the prefill); the mean over requests.
- **throughput_ratio**: split server throughput / the best server-only SD throughput (same
  definition) among the baseline configurations (batch = each client count x {1/2, 1, 2}, gamma
  2/4/6) whose ITL is no worse than the split run's (``baseline_within_itl`` False when none is:
  then the fastest-ITL one is used); ``ratio_cpu``, ``ratio_busy`` and ``ratio_wall`` give all three.
- **the headline** ("at equal ITL"): every ``--clients`` count (2, 4, 8, 16, 24, 32 by default) runs at
  the first RTT with every proactive / cohort setting; the reported configuration is the one with
  the highest throughput_ratio there -- each run against the best baseline at an ITL no worse than
  its own, so a larger split batch wins only if its throughput beats the baseline configurations
  that are at least as fast per token (:func:`best_split`). The other RTTs run ``--sweep-clients`` (the fewest, the middle and the most by default).
- **server_utilisation**: the server's time in target forwards / its span.

Where the split loses on one CPU box (measured; the columns show it):

- the verification itself is not where: in one process on one thread the verifier costs 1.09-1.27x
  less CPU per emitted token than the SD engine at the same batch and depth (no draft passes, and
  finished rows leave the batch): ``python -m runtime.split.verify_timing --vs-engine``;
- ``verify_cpu_share``: the rest of the server process (gRPC, (de)serialisation, a thread per
  stream, futures) takes ~7-10 % of its CPU;
- new requests' prompts: a prompt verified in the same padded forward as the other rows made
  every row as wide as the prompt (~40 tokens instead of ~8); they are now prefilled in a forward
  of their own (the verifier's ``gather_s`` includes it);
- the per-batch gather of every client's KV into a padded batch and the split back (~15 % of a
  verify at 8 rows) is gone where a cohort comes back together (``kv_reused``: the share of batches
  that kept their clients' cache; a cohort cut by the batching window re-stacks);
- the edge: one process stands in for every client, on one core. Its clients draft on one device
  in one batched forward per step (``--shared-device auto``: batched for a Llama draft;
  :mod:`runtime.split.batched_drafter`), so a block costs about one client's drafting time instead
  of waiting for every other client's (``device_wait_ms``: the wait to join the running batch;
  ``draft_ms``: the block's wall time, joint steps included). Paired against the previous default,
  the blocks drafted one after another (``--shared-device on``; ``experiments.split_bench_ab``,
  8/16/32 clients, 1 and 2 cohorts, 2 repeats: ``results/split_bench/ab_batched_vs_d4fda49``),
  ITL fell by 22-54 % in every configuration. What is left on the edge: its Python threads (a
  client, a link and its emulated delay each) share the one core with the device, so at 32 clients
  ``network_ms`` grows beyond the emulated RTT;
- cohorts halve the verification batch and alternate (``cohort_alternation``); the server's
  utilisation with one cohort, ``u1``, caps what a second can add at ``1 / u1`` (each target line
  gives it; the tally line counts the cells where that ceiling leaves 1.5x open): on this CPU a
  verification of 8-32 rows takes tens of ms against a few ms of batched drafting and a 5 ms RTT
  (``server_compute_ms``, ``draft_ms``), so one cohort often keeps the server more than 2/3 busy,
  and then the issue's 1.5x is out of reach. With 2 clients, SpecEdge's own setting, a
  verification of one row is as long as the network at 10-40 ms RTT, and a second cohort lifts
  utilisation past 1.5x (``results/split_bench``: 6 of the 8 2-client cells; the other two, proactive
  on at 5 and 10 ms, within 0.03 of their ceiling). Utilisation is
  not throughput: a verification of one row costs most of what one of two rows costs here (a
  forward's fixed cost; ``server_compute_ms``), so at 2 clients the second cohort's extra busy
  time buys fewer tokens per server CPU second, not more (``server_tokens_per_cpu_s``). A window
  shorter than a cohort's arrival spread cuts it into batches that then stay apart (``mean_batch``
  below the cohort's size). ``proactive_hit_rate_drafted`` counts hits only among iterations that
  drafted ahead at all. ``transport_overhead_ms`` is the round trip beyond the emulated WAN
  (``runtime.split.transport_timing`` measures gRPC against the in-process link alone);
- proactive drafting shortens an iteration only where the server waits for the edge: with two
  cohorts at 5 ms the server is 82-100 % busy and drafting ahead has little to hide, and at 24-32
  clients it adds work to the edge's one core (blocks drafted and then thrown away), where the
  clients' own threads already queue (``network_ms`` beyond the RTT). Where it *raises* the ITL
  with two cohorts, the depth controller is a cause: with proactive drafting on, the first
  iteration already gives the controller a draft time, its first step lands above the middle of
  the range and its first probe goes down (to depth 2; with it off the controller waits, then
  probes up to 8), so over these 64-token requests its mean depth is ~0.5 lower (``mean_depth``,
  ``accepted_per_iteration``; e.g. 6.72 vs 7.21 at 16 clients in
  ``results/split_bench/ab_yield_vs_equal``, whose ``iteration_logs`` hold the sequences), and a
  server-bound cohort's ITL is its period over fewer tokens. At a fixed depth 8 (``--depth 8``, ``results/split_bench/fixed_depth8``) the two
  cohorts' proactive on vs off is +3.5 % (8 clients) and +0.4 % (16 clients): no loss, but within
  the runs' spread, and one cohort at 8 clients is 12 % worse there, so the controller is not the
  whole story. A probe towards the side the controller predicts better (``--depth-probe cheaper``;
  ``results/split_bench/ab_probe_cheaper``, paired against ``inside``) keeps the proactive runs'
  mean depth at 7.25-7.43 (2-16 clients), ITL cheaper/inside 0.81-1.07 there, but at 32 clients
  it ran at depth 2.2-4.5 with the ITL 13-26 % higher (the 26 % mostly one run, 32.2 ms at depth
  2.2; 6 of the 16 32-client runs saw a host load of 3.1-6.5, against at most 2.4 in the other
  A/B; why the controller went shallow there is not established): the default stays ``inside``. Whether the proactive rows of a batched draft
  device yield to on-demand rows (``--proactive-priority``) changed nothing beyond the noise
  (``results/split_bench/ab_yield_vs_equal``);
- noise: a cell is the mean of ``--repeats`` runs, and the columns ``itl_ms_min`` / ``itl_ms_max``
  show how far its runs were apart (up to 27 % in the published run; +-28 % on a host whose speed flipped between two
  states from one second to the next); the baseline is swept before every repeat of the grid and
  after the last, and ``split_bench_runs.csv`` compares each run with the mean of the two sweeps
  either side of its repeat (paired in time; ``DIR/baseline_sweeps.csv`` holds every sweep), the
  cell's ``throughput_ratio_paired`` is the mean of those, its ``throughput_ratio`` the cell's mean
  against the mean of all sweeps.

Timings need an idle machine; every number comes with the command line in the markdown. This
module runs and measures; the comparison of the runs with the baseline, the target checks and the report text are
:mod:`experiments.split_bench_analysis`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from agents.artefacts import require_writable, write_csv_atomic, write_text_atomic
from experiments.process_cpu import CpuSampler
from experiments.split_bench_analysis import (
    THROUGHPUT,
    cell_means,
    cohort_alternation,
    compare,
    drafted_hit_rate,
    markdown,
    mean_sweep,
    paired_baseline,
    run_row,
    with_paired_ratio,
)
from runtime.cpu_pinning import available_cpus, pin_process
from runtime.engines import drain, sd_steps
from runtime.pair import CODE_PROMPTS, PROSE_PROMPTS
from runtime.split.batched_drafter import PROACTIVE_PRIORITIES
from runtime.split.depth import PROBES

ROOT = Path(__file__).resolve().parent.parent


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--preset", default="full", help="the project's pair to use (full, tiny, ...)")
    ap.add_argument("--pair", type=Path, default=None)
    ap.add_argument("--device", default="cpu", help="where the server, the edge and the baseline run (cuda: all on one GPU)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--edge-device", default=None, help="where the edge process drafts (default --device; on a one-GPU box use cpu: "
                    "two processes time-sharing one GPU slow each other down by tens of ms)")
    ap.add_argument("--edge-dtype", default=None, help="the edge's dtype (default --dtype)")
    ap.add_argument("--rtt-ms", type=_floats, default=[5.0, 10.0, 20.0, 40.0])
    ap.add_argument("--proactive", default="on,off")
    ap.add_argument("--cohorts", type=_ints, default=[1, 2])
    # several client counts: the comparison is at equal ITL, and larger verification batches amortise
    # a forward's fixed cost (8 clients in 2 cohorts gave batches of ~3.6 rows against the baseline's 8-16);
    # 2 clients is SpecEdge's own headline setting (two edges, server batch 1 per cohort), and with few
    # clients a verification is short against the network and the drafting: the regime cohorts are for
    ap.add_argument("--clients", type=_ints, default=[2, 4, 8, 16, 24, 32],
                    help="edge clients per run (comma list): every count at the first RTT, --sweep-clients at the others")
    # both ends and the middle: with few clients the network and the drafting are as long as a
    # verification (the regime cohorts are for), with many the server's verification dominates an iteration
    ap.add_argument("--sweep-clients", type=_ints, default=None,
                    help="edge client counts (comma list) at the RTTs after the first (default: the smallest, the middle (lower median) "
                         "and the largest of --clients)")
    ap.add_argument("--requests", type=int, default=2, help="requests per client")
    # two: one run of a cell is ~15 s of serving, and this shared host's speed flips between two states
    # from one second to the next (the same target pass took 8.3 or 13 ms), so single runs of a cell moved ITL by ~20 %
    ap.add_argument("--repeats", type=int, default=2,
                    help="runs of every cell, the grid swept that many times over (a cell's figures are the mean of its runs)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--depth", default="auto")
    ap.add_argument("--jitter-ms", type=float, default=1.0)
    ap.add_argument("--bandwidth-mbps", type=float, default=100.0)
    # 20 ms, chosen when the edge's clients drafted one after another (``--shared-device on``): their requests arrived
    # spread over ~clients x depth x draft time, and a 5 ms window cut one cohort of 8 into batches of ~3.5 (which then
    # stay apart: one cohort interleaving as two); batched drafting narrows the spread, the window was not re-tuned
    ap.add_argument("--window-ms", type=float, default=20.0, help="how long a verification batch waits for the rest of its cohort")
    ap.add_argument("--shared-device", choices=["auto", "batched", "on", "off"], default="auto",
                    help="runtime.edge --shared-device: batched (auto with a Llama draft), the edge's clients' draft steps run as one "
                         "batched forward on its one device; on, they draft one after another (staggered arrivals); off, they draft "
                         "concurrently with the model's own forward (interleaved on one thread)")
    ap.add_argument("--depth-probe", choices=list(PROBES), default="inside",
                    help="runtime.edge --depth-probe: which way the depth controller probes (results/split_bench/ab_probe_cheaper)")
    ap.add_argument("--proactive-priority", choices=list(PROACTIVE_PRIORITIES), default="equal",
                    help="runtime.edge --proactive-priority: with a batched draft device, equal (every row in every step) or yield (a "
                         "step with on-demand rows leaves the proactive rows out; results/split_bench/ab_yield_vs_equal)")
    # on one machine the edge and the server share its cores: unpinned, the edge's (proactive) drafting
    # slowed the server's forwards by 6-25 % (server_compute_ms, proactive on vs off); a testbed has two devices
    ap.add_argument("--pin-cpus", choices=["on", "off"], default="on" if len(available_cpus()) >= 2 else "off",
                    help="on (default where 2+ CPUs are available): the server process and the server-only baseline on one CPU, the "
                         "edge process on another (runtime.cpu_pinning), as on a testbed of two devices; off: both anywhere")
    ap.add_argument("--baseline", type=Path, default=None, help="reuse this baseline.csv (from an earlier run on the same settings) instead of sweeping (then every run and every cell "
                    "is compared with it: the paired and the cell ratios use the same baseline)")
    ap.add_argument("--timeout-s", type=float, default=900.0, help="per split run")
    ap.add_argument("--throughput", choices=list(THROUGHPUT), default=None,
                    help="which server throughput throughput_ratio uses (default: cpu on a CPU server, busy on CUDA; see the definitions above)")
    args = ap.parse_args(argv)
    args.throughput = args.throughput or ("cpu" if args.device == "cpu" else "busy")
    args.proactive = [p for p in args.proactive.split(",") if p]
    # finite checks: NaN passes no comparison, so "r < 0" alone let NaN and inf through
    if not args.rtt_ms or not all(0 <= r < math.inf for r in args.rtt_ms) or not set(args.proactive) <= {"on", "off"} or not args.proactive:
        raise SystemExit("--rtt-ms needs finite values >= 0 and --proactive a list of on/off")
    if not (0 <= args.jitter_ms < math.inf and 0 < args.bandwidth_mbps < math.inf and 0 <= args.window_ms < math.inf and 0 < args.timeout_s < math.inf):
        raise SystemExit("--jitter-ms and --window-ms must be finite numbers >= 0, --bandwidth-mbps and --timeout-s finite numbers > 0")
    if args.depth != "auto" and not (args.depth.isdigit() and int(args.depth) >= 1):
        raise SystemExit(f"--depth must be auto or an integer >= 1, got {args.depth!r}")
    from runtime.pair import device_dtype_problem

    for device, dtype in ((args.device, args.dtype), (args.edge_device or args.device, args.edge_dtype or args.dtype)):
        if problem := device_dtype_problem(device, dtype):
            raise SystemExit(problem)
    if args.baseline is not None and not args.baseline.is_file():
        raise SystemExit(f"--baseline must be an earlier run's baseline.csv, got {str(args.baseline)!r} (no such file)")
    if args.pair is not None and not args.pair.is_dir():
        raise SystemExit(f"--pair must be a built pair folder (target/ + draft/), got {str(args.pair)!r}")
    require_writable(args.out, "--out", directory=True)
    if not args.cohorts or min(args.cohorts) < 1 or not args.clients or min(args.clients) < 1 or args.requests < 1 or args.max_new_tokens < 2:
        raise SystemExit("--cohorts, --clients and --requests must be >= 1 and --max-new-tokens >= 2")
    if args.repeats < 1:
        raise SystemExit(f"--repeats must be >= 1, got {args.repeats}")
    for name in ("rtt_ms", "clients", "sweep_clients", "cohorts"):
        values = getattr(args, name) or []
        if len(set(values)) != len(values):  # a repeated value would run a cell twice into one folder and merge it as repeats
            raise SystemExit(f"--{name.replace('_', '-')} must not repeat a value, got {values}")
    args.sweep_clients = args.sweep_clients or sorted({min(args.clients), statistics.median_low(args.clients), max(args.clients)})
    if min(args.sweep_clients) < 1:
        raise SystemExit(f"--sweep-clients must all be >= 1, got {args.sweep_clients}")
    cpus = sorted(available_cpus())
    if args.pin_cpus == "on" and len(cpus) < 2:
        raise SystemExit(f"--pin-cpus on needs 2 CPUs this process may use, got {len(cpus)} ({cpus}): use --pin-cpus off")
    #: (server and baseline CPU, edge CPU), or None
    args.cpu_pair = (cpus[0], cpus[1]) if args.pin_cpus == "on" else None
    args.out.mkdir(parents=True, exist_ok=True)
    return args


def _env() -> dict:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": path}


def _pair_flags(args, edge: bool = False) -> list[str]:
    device = (args.edge_device or args.device) if edge else args.device
    dtype = (args.edge_dtype or args.dtype) if edge else args.dtype
    pin = ["--cpus", str(args.cpu_pair[1 if edge else 0])] if args.cpu_pair else []
    return [*(["--pair", str(args.pair)] if args.pair else ["--preset", args.preset]), "--device", device, "--dtype", dtype, *pin]


def split_run(args, rtt: float, proactive: str, cohorts: int, clients: int, folder: Path, edge_flags: Sequence[str] = ()) -> dict:
    """One server process + one edge process on loopback; returns the edge summary and server stats.
    ``edge_flags``: more ``runtime.edge`` arguments (e.g. ``--temperature``; :mod:`experiments.depth_settle`)."""
    server_cmd = [sys.executable, "-m", "runtime.split_server", *_pair_flags(args), "--port", "0", "--threads", "1", "--cohorts", str(cohorts),
                  "--window-ms", str(args.window_ms), "--idle-exit-s", "1", "--stats-out", str(folder / "server.json")]
    server = subprocess.Popen(server_cmd, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = ""
        while "listening on" not in line:
            line = server.stdout.readline()
            if not line and server.poll() is not None:
                raise RuntimeError(f"the split server exited with {server.returncode}: {' '.join(server_cmd)}")
        addr = line.split("listening on ")[1].strip()
        sampler = CpuSampler(server.pid)
        edge_cmd = [sys.executable, "-m", "runtime.edge", *_pair_flags(args, edge=True), "--server", addr, "--threads", "1", "--clients", str(clients),
                    "--requests", str(args.requests), "--max-new-tokens", str(args.max_new_tokens), "--rtt-ms", str(rtt),
                    "--jitter-ms", str(args.jitter_ms), "--bandwidth-mbps", str(args.bandwidth_mbps), "--proactive", proactive,
                    "--depth", str(args.depth), "--shared-device", args.shared_device, "--proactive-priority", args.proactive_priority, "--depth-probe", args.depth_probe, "--log", str(folder / "iterations.jsonl"), "--summary", str(folder / "edge.json"), *edge_flags]
        edge = subprocess.run(edge_cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=args.timeout_s)
        if edge.returncode != 0:
            raise RuntimeError(f"the edge failed ({edge.returncode}): {edge.stderr[-1500:]}")
        sampler.stop()  # the serving is over (the edge has left)
        try:
            server.wait(timeout=30)  # it stops by itself once the edge has left
        except subprocess.TimeoutExpired:
            print("[split_bench] the split server did not stop by itself within 30 s: SIGTERM", flush=True)
            server.terminate()
            server.wait(timeout=30)
    finally:
        server.kill()
        server.wait()
    stats = json.loads((folder / "server.json").read_text())
    logs = [json.loads(line) for line in (folder / "iterations.jsonl").read_text().splitlines() if line.strip()]
    # serving CPU: the server process's CPU (verification, gRPC, batching, idle polling) from the
    # first request's send to the last reply -- not the model loading nor the idle exit
    stats["cpu_s"] = sampler.between(min(x["sent_at"] for x in logs), max(x["reply_at"] for x in logs)) if logs else None
    stats["cohort_alternation"] = cohort_alternation(logs)
    stats["proactive_hit_rate_drafted"] = drafted_hit_rate(logs)
    # on a shared draft device: how long a client's block waited for the device, against its drafting
    stats["device_wait_ms"] = float(np.mean([x.get("device_wait_ms", 0.0) for x in logs])) if logs else None
    stats["draft_ms"] = float(np.mean([x["draft_ms"] for x in logs])) if logs else None
    return {"edge": json.loads((folder / "edge.json").read_text()), "server": stats}


def baseline_sweep(args, pair) -> pd.DataFrame:
    """Server-only SD on the split's requests (same prompts, same token limit) in batches, one process, one torch thread
    (with ``--pin-cpus on`` on the split server's CPU)."""
    if args.cpu_pair is None:
        return _baseline_sweep(args, pair)
    before = available_cpus()
    pin_process({args.cpu_pair[0]})
    try:
        return _baseline_sweep(args, pair)
    finally:
        pin_process(before)


def _baseline_sweep(args, pair) -> pd.DataFrame:
    torch.set_num_threads(1)
    tok = pair.tokenizer
    prompts = [tok.encode(p) for p in CODE_PROMPTS + PROSE_PROMPTS]
    rows = []
    # the same requests the split serves (runtime.edge: client i's request k is prompt (i * requests + k) mod the list), in batches
    # (for the largest client count; the smaller runs serve a prefix of these)
    work = [prompts[(i * args.requests + k) % len(prompts)] for i in range(max(*args.clients, *args.sweep_clients)) for k in range(args.requests)]
    batches = sorted({b for c in {*args.clients, *args.sweep_clients} for b in (max(1, c // 2), c, 2 * c)})
    for batch, gamma in itertools.product(batches, (2, 4, 6)):
        itls: list[float] = []
        t0, cpu0 = time.perf_counter(), time.process_time()
        tokens = 0
        for start in range(0, len(work), batch):
            chunk = work[start : start + batch]
            emits: dict[int, list[tuple[float, int]]] = {i: [] for i in range(len(chunk))}
            res = drain(sd_steps(pair.target, pair.draft, chunk, gamma, args.max_new_tokens, eos_id=tok.eos_id, pad_id=tok.pad_id,
                                 on_tokens=lambda row, ids, emits=emits: emits[row].append((time.perf_counter(), len(ids)))))
            tokens += res.generated
            itls += [(e[-1][0] - e[0][0]) / sum(n for _, n in e[1:]) * 1e3 for e in emits.values() if len(e) > 1 and sum(n for _, n in e[1:])]
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        rows.append({"batch": batch, "gamma": gamma, "tokens_per_s": tokens / wall, "tokens_per_cpu_s": tokens / cpu if cpu > 0 else float("nan"),
                     "itl_ms": sum(itls) / len(itls) if itls else float("nan")})
        print(f"[split_bench] server-only SD batch {batch} gamma {gamma}: {rows[-1]['tokens_per_s']:.1f} tok/s, ITL {rows[-1]['itl_ms']:.2f} ms", flush=True)
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from runtime.pair import build_pair, load_pair

    pair = load_pair(args.pair or build_pair(recipe=args.preset, progress=False), device=args.device, dtype=args.dtype)
    load0 = os.getloadavg()[0]
    # the baseline is swept before every repeat of the grid and after the last: on a shared machine the
    # host's speed drifts over the minutes the grid takes, so each run is compared with the sweeps either
    # side of its repeat (paired in time: split_bench_runs.csv) and a cell with the mean of all of them
    sweeps = [pd.read_csv(args.baseline)] if args.baseline else []
    raw = []
    first = args.rtt_ms[0]
    cells = [(rtt, p, c, n) for rtt in args.rtt_ms for n in (args.clients if rtt == first else args.sweep_clients) for p in args.proactive for c in args.cohorts]
    # the whole grid, --repeats times over: a cell's repeats are minutes apart, so the host's drift spreads over every cell alike
    grid = [(r, *cell) for r in range(args.repeats) for cell in cells]
    for k, (repeat, rtt, proactive, cohorts, clients) in enumerate(grid, 1):
        if not args.baseline and len(sweeps) == repeat:
            sweeps.append(baseline_sweep(args, pair))
        name = f"rtt{rtt:g}_clients{clients}_proactive-{proactive}_cohorts{cohorts}" + (f"_repeat{repeat}" if args.repeats > 1 else "")
        folder = args.out / "runs" / name
        folder.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        load = os.getloadavg()[0]
        run = split_run(args, rtt, proactive, cohorts, clients, folder)
        raw.append({**run_row(args, rtt, proactive, cohorts, clients, {**run, "load": load}), "repeat": repeat})
        split_col = THROUGHPUT[args.throughput][0]
        print(f"[split_bench] {k}/{len(grid)} rtt {rtt:g} ms, {clients} clients, proactive {proactive}, cohorts {cohorts}, repeat {repeat}: "
              f"{raw[-1][split_col]:.1f} tok/s ({args.throughput}), ITL {raw[-1]['itl_ms']:.2f} ms, utilisation {raw[-1]['server_utilisation']:.2f} "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)
    if not args.baseline:
        sweeps.append(baseline_sweep(args, pair))
    write_csv_atomic(pd.concat([s.assign(sweep=i) for i, s in enumerate(sweeps)]), args.out / "baseline_sweeps.csv", index=False)
    base = mean_sweep(sweeps)
    write_csv_atomic(base, args.out / "baseline.csv", index=False)
    paired = [paired_baseline(sweeps, r) for r in range(args.repeats)]  # one baseline per repeat, not one per run
    runs = pd.DataFrame([compare(row, paired[row["repeat"]], args.throughput) for row in raw])
    write_csv_atomic(runs, args.out / "split_bench_runs.csv", index=False)
    df = with_paired_ratio(pd.DataFrame([compare(row, base, args.throughput) for row in cell_means(raw)]), runs)
    write_csv_atomic(df, args.out / "split_bench.csv", index=False)
    cmd = "python -m experiments.split_bench " + " ".join(argv if argv is not None else sys.argv[1:])
    md = markdown(args, cmd, df, base, sweeps=len(sweeps), load=(load0, os.getloadavg()[0]))
    write_text_atomic(args.out / "split_bench.md", "\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    main()
