"""Does the live depth controller settle within +-1 of a sweep's best depth within 20 iterations?

Issue #14 asks of the per-client draft-depth controller (:mod:`runtime.split.depth`, ``runtime.edge
--depth auto``) that it "applies the calibration rule and settles within +-1 of the best depth of a
sweep within 20 iterations". ``tests/test_split_depth_controller.py`` checks it against a
discrete-event simulation's sweep; this experiment checks it on the live runtime: the split server
and the edge process over loopback, as ``experiments.split_bench`` runs them.

    python -m experiments.depth_settle --out results/depth_settle
    python -m experiments.depth_settle --out /tmp/ds --preset tiny --rtt-ms 5 --depths 1,2 --max-new-tokens 16 --repeats 1  # a smoke run
    python -m experiments.depth_settle --out /tmp/ds_t1 --temperature 1 --seeds per-repeat --requests 4 --max-new-tokens 128 --repeats 3
    python -m experiments.depth_settle --out /tmp/ds_t1h --temperature 1 --seeds per-repeat --requests 4 --max-new-tokens 128 --repeats 3 --depth-hold 0.01 --depth-memory 0.995 --sweep-from /tmp/ds_t1
        # (a controller variant against that sweep and its texts: only the auto runs)
    python -m experiments.depth_settle --report results/depth_settle/greedy   # rebuild a run's report from its CSVs

For every RTT, and every repeat: one run at each fixed depth of ``--depths`` (the sweep) and one
with ``--depth auto`` (the controller, started as ``runtime.edge`` starts it: depth 4, acceptance
prior 0.7, no profile), each ``experiments.split_bench.split_run`` (server and edge pinned to a
core each where two are free). The repeats run the whole RTT x depth grid again, minutes later,
so the host's drift falls on every depth alike.

- **the sweep's best depth**: the fixed depth with the lowest mean inter-token latency (ITL, the
  clients' per-token time, which the controller minimises: it maximises its client's tokens per
  second) over the texts the runs generated (one text: one request of one client under one edge
  seed; every depth serves the same ones); ``tied_depths`` lists the depths whose paired ITL
  difference to the best has a 95 % bootstrap interval over the texts that reaches 0, i.e. the
  depths the sweep cannot tell apart from it (:mod:`experiments.sweep_best`; runs recorded before
  ``requests.csv`` existed: the runs' mean ITL, ties by overlapping ITL ranges). Why texts: under
  sampling a run's ITL depends on how often the target accepts the drafts of the text it drew --
  with ``--seeds fixed`` (the default, so earlier commands reproduce) every repeat re-draws the same
  texts, and at temperature 1 the best depth was the one whose two texts happened to be accepted
  most (``results/depth_settle/temperature1``); ``--seeds per-repeat`` gives each repeat new ones;
- **a client's trace**: the depth of each of its iterations, in order (its requests one after
  another: a client keeps its controller across requests), leaving out the iterations whose depth
  the token limit set (a request's last blocks: the edge drafts ``min(the controller's depth,
  tokens left - 1)``; ``traces.csv`` keeps them, flagged ``capped``);
- **settled after**: the number of leading iterations after which every later iteration drafts
  within +-1 of the sweep's best (0: in the band from the first); the target holds for a client
  when that is <= 20 and it ran more than 20 iterations (fewer: ``too_short``, not counted as met);
  ``met_tied``: the same within +-1 of any tied depth (the judgement the sweep's resolution allows);
- ``in_band_after_20``: the share of a client's iterations after the 20th within +-1;
  ``auto_itl_ms`` against ``best_itl_ms``: what the controller's choices cost the client.

Writes ``DIR/sweep.csv`` (one row per run), ``DIR/traces.csv`` (one row per auto iteration),
``DIR/requests.csv`` (one row per run and request: the text's seed, client and request, its ITL),
``DIR/depth_settle.csv`` (one row per RTT and client trace), ``DIR/depth_settle.md`` and
``DIR/depth_settle.png``. Timings need an idle machine; the markdown records the host's load.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from agents.artefacts import write_csv_atomic, write_text_atomic
from experiments import split_bench
from experiments.depth_settle_assess import assess, client_traces
from experiments.depth_settle_report import markdown, plot

MAX_DEPTH = 8  #: runtime.edge's --max-depth default: the controller's range and the largest fixed depth the edge accepts


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, argparse.Namespace]:
    """This experiment's options and the ``experiments.split_bench`` namespace its runs use (that
    module's checks and defaults: pair, device, pinning, jitter, bandwidth, window, ...); any
    option not named here is passed on to it."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rtt-ms", default="5,20,40", help="comma-separated RTTs, ms")
    ap.add_argument("--depths", type=_ints, default=list(range(1, MAX_DEPTH + 1)), help="the sweep's fixed depths (the controller's range is runtime.edge's 1..8)")
    ap.add_argument("--clients", type=int, default=2, help="edge clients (one per cohort with 2 cohorts: SpecEdge's own setting)")
    ap.add_argument("--cohorts", type=int, default=2)
    ap.add_argument("--proactive", choices=["on", "off"], default="on")
    ap.add_argument("--requests", type=int, default=1, help="requests per client (its controller is kept across them)")
    ap.add_argument("--max-new-tokens", type=int, default=256, help="tokens per request (enough for > 20 iterations at depth 8)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--seeds", choices=["fixed", "per-repeat"], default="fixed",
                    help="the edge's --seed: 0 in every run (fixed: the repeats re-measure the same texts) or the repeat's number "
                         "(per-repeat: each repeat draws new texts -- what a sampling sweep needs; fixed is the default so that "
                         "earlier runs' commands reproduce them)")
    ap.add_argument("--depth-hold", type=float, default=0.0,
                    help="the auto runs' controller: runtime.edge --depth-hold (keep a near-best depth; 0: off)")
    ap.add_argument("--depth-memory", type=float, default=0.98, help="the auto runs' controller: runtime.edge --depth-memory")
    ap.add_argument("--sweep-from", type=Path, default=None, metavar="DIR",
                    help="reuse the fixed-depth runs of a finished run in DIR (same settings but the controller's, and its "
                         "requests.csv) and run only the controller: a controller variant against the same sweep and texts")
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="the edge's sampling temperature (runtime.edge --temperature; 0: greedy). Sampling lowers acceptance "
                         "(sample-and-match), which moves the best depth inside the range")
    own, rest = ap.parse_known_args(argv)
    if not own.depths or min(own.depths) < 1 or max(own.depths) > MAX_DEPTH or len(set(own.depths)) != len(own.depths):
        raise SystemExit(f"--depths must be distinct integers in [1, {MAX_DEPTH}], got {own.depths}")
    if own.repeats < 1:
        raise SystemExit(f"--repeats must be >= 1, got {own.repeats}")
    if not 0 <= own.temperature < math.inf:
        raise SystemExit(f"--temperature must be a finite number >= 0, got {own.temperature}")
    if not 0 <= own.depth_hold < 1 or not 0 < own.depth_memory <= 1:
        raise SystemExit(f"--depth-hold must lie in [0, 1) (got {own.depth_hold}) and --depth-memory in (0, 1] (got {own.depth_memory})")
    bench = split_bench.parse_args(["--out", str(own.out), "--rtt-ms", own.rtt_ms, "--clients", str(own.clients), "--cohorts", str(own.cohorts),
                                    "--proactive", own.proactive, "--requests", str(own.requests), "--max-new-tokens", str(own.max_new_tokens),
                                    "--repeats", str(own.repeats), *rest])
    return own, bench


def controller_flags(own: argparse.Namespace, depth: str) -> list[str]:
    """The ``runtime.edge`` flags of the controller's settings for an auto run (none for a fixed depth,
    and none at their defaults, so the runs of earlier commands stay as they were)."""
    if depth != "auto":
        return []
    return ([] if own.depth_hold == 0 else ["--depth-hold", str(own.depth_hold)]) + ([] if own.depth_memory == 0.98 else ["--depth-memory", str(own.depth_memory)])


CONTROLLER_OPTIONS = ("depth_hold", "depth_memory", "depth_probe")  #: settings that change only the auto runs


def recorded_command(folder: Path) -> str:
    """The command a finished run's markdown records (SystemExit when ``folder`` holds none)."""
    md_path = folder / "depth_settle.md"
    first = md_path.read_text().split("Command: `", 1)[1].split("`", 1)[0] if md_path.is_file() else ""
    if not first.startswith("python -m experiments.depth_settle"):
        raise SystemExit(f"need a finished run's folder (depth_settle.md naming its command), got {str(folder)!r}")
    return first


def reused_sweep(own: argparse.Namespace, bench: argparse.Namespace) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``--sweep-from DIR``: DIR's fixed-depth runs and their requests, after checking that DIR ran
    with this run's settings (all but the controller's and the output folder)."""
    folder = own.sweep_from
    argv = shlex.split(recorded_command(folder))[3:]
    i = argv.index("--out")
    old_own, old_bench = parse_args([*argv[:i], "--out", str(own.out), *argv[i + 2 :]])
    ignore = {"out", "sweep_from", *CONTROLLER_OPTIONS}
    differ = sorted({k for ns, old in ((own, old_own), (bench, old_bench)) for k in vars(ns) if k not in ignore and vars(ns)[k] != vars(old).get(k)})
    if differ:
        raise SystemExit(f"--sweep-from {folder}: that run's settings differ from this one's in {', '.join(differ)} (only the controller's may)")
    if not (folder / "requests.csv").is_file():
        raise SystemExit(f"--sweep-from {folder}: it has no requests.csv (runs before it cannot pair the controller's texts with the sweep's)")
    sweep, texts = pd.read_csv(folder / "sweep.csv", dtype={"depth": str}), pd.read_csv(folder / "requests.csv", dtype={"depth": str})
    return sweep[sweep.depth != "auto"], texts[texts.depth != "auto"]


def run(own: argparse.Namespace, bench: argparse.Namespace) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Every (repeat, RTT, depth) run; returns the per-run table, the auto runs' iterations and the
    per-request table (one row per run and request: its text's key and ITL)."""
    runs, iterations, texts = [], [], []
    depths = ["auto"] if own.sweep_from is not None else [*map(str, own.depths), "auto"]  # --sweep-from: the fixed runs are reused
    grid = [(r, rtt, d) for r in range(own.repeats) for rtt in bench.rtt_ms for d in depths]
    for k, (repeat, rtt, depth) in enumerate(grid, 1):
        folder = own.out / "runs" / f"rtt{rtt:g}_depth-{depth}_repeat{repeat}"
        folder.mkdir(parents=True, exist_ok=True)
        load, t0 = os.getloadavg()[0], time.perf_counter()
        seed = repeat if own.seeds == "per-repeat" else 0
        result = split_bench.split_run(argparse.Namespace(**{**vars(bench), "depth": depth}), rtt, own.proactive, own.cohorts, own.clients, folder,
                                      edge_flags=["--temperature", str(own.temperature), "--seed", str(seed), *controller_flags(own, depth)])
        edge = result["edge"]
        for req in edge["requests_detail"]:  # request c{i}r{k}: client i's k-th request, the same text at every depth of this seed
            client, _, request = req["request_id"].lstrip("c").partition("r")
            texts.append({"repeat": repeat, "rtt_ms": rtt, "depth": depth, "seed": seed, "client": int(client), "request": int(request),
                          "outcome": req["outcome"], "tokens": req["tokens"], "itl_ms": req["itl_ms"]})
        runs.append({"repeat": repeat, "rtt_ms": rtt, "depth": depth, "itl_ms": edge["itl_ms"], "mean_depth": edge["mean_depth"],
                     "accepted_per_iteration": edge["accepted_per_iteration"], "network_ms": edge["network_ms"],
                     "server_compute_ms": edge["server_compute_ms"], "server_utilisation": result["server"]["utilisation"],
                     "outcomes": json.dumps(edge["outcomes"]), "host_load_1min": load})
        if depth == "auto":
            logs = [json.loads(line) for line in (folder / "iterations.jsonl").read_text().splitlines() if line.strip()]
            for client, trace in client_traces(logs, own.max_new_tokens).items():
                iterations += [{"repeat": repeat, "rtt_ms": rtt, "client": client, "position": i, "depth": d, "capped": capped}
                               for i, (d, capped) in enumerate(trace)]
        print(f"[depth_settle] {k}/{len(grid)} rtt {rtt:g} ms, depth {depth}, repeat {repeat}: ITL {edge['itl_ms']:.2f} ms, "
              f"mean depth {edge['mean_depth']:.2f} ({time.perf_counter() - t0:.0f} s)", flush=True)
    return (pd.DataFrame(runs), pd.DataFrame(iterations, columns=["repeat", "rtt_ms", "client", "position", "depth", "capped"]),
            pd.DataFrame(texts, columns=["repeat", "rtt_ms", "depth", "seed", "client", "request", "outcome", "tokens", "itl_ms"]))


def report(folder: Path) -> str:
    """Rebuild ``depth_settle.csv``, ``.md`` and ``.png`` of a finished run from its ``sweep.csv`` and
    ``traces.csv`` with this code (the run's settings: the command its markdown records)."""
    md_path = folder / "depth_settle.md"
    first = recorded_command(folder)
    argv = shlex.split(first)[3:]
    i = argv.index("--out")
    own, bench = parse_args([*argv[:i], "--out", str(folder), *argv[i + 2 :]])
    sweep, traces = pd.read_csv(folder / "sweep.csv", dtype={"depth": str}), pd.read_csv(folder / "traces.csv")
    texts = pd.read_csv(folder / "requests.csv", dtype={"depth": str}) if (folder / "requests.csv").is_file() else None  # runs before it: None
    result = assess(sweep, traces, texts)
    write_csv_atomic(result, folder / "depth_settle.csv")
    load = f"1-minute load average {sweep.host_load_1min.iloc[0]:.1f} at the first run's start and {sweep.host_load_1min.iloc[-1]:.1f} at the last's"
    md = markdown(own, bench, first, sweep, result, load).replace(
        f"Command: `{first}`", f"Command: `{first}`\n\nReport rebuilt from its CSVs: `python -m experiments.depth_settle --report {folder}`", 1)
    write_text_atomic(md_path, md)
    plot(sweep, result, folder / "depth_settle.png")
    return md


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--report"]:
        if len(argv) != 2:
            raise SystemExit("usage: python -m experiments.depth_settle --report DIR")
        print(report(Path(argv[1])))
        return
    own, bench = parse_args(argv)
    reused = reused_sweep(own, bench) if own.sweep_from is not None else None  # checked before any run starts
    load0 = os.getloadavg()[0]
    sweep, traces, texts = run(own, bench)
    if reused is not None:
        sweep, texts = pd.concat([reused[0], sweep], ignore_index=True), pd.concat([reused[1], texts], ignore_index=True)
    result = assess(sweep, traces, texts)
    write_csv_atomic(sweep, own.out / "sweep.csv")
    write_csv_atomic(traces, own.out / "traces.csv")
    write_csv_atomic(texts, own.out / "requests.csv")
    write_csv_atomic(result, own.out / "depth_settle.csv")
    cmd = "python -m experiments.depth_settle " + shlex.join(argv)
    md = markdown(own, bench, cmd, sweep, result, f"1-minute load average {load0:.1f} at the start and {os.getloadavg()[0]:.1f} at the end")
    write_text_atomic(own.out / "depth_settle.md", md)
    plot(sweep, result, own.out / "depth_settle.png")
    print(md)


if __name__ == "__main__":
    main()
