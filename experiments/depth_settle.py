"""Does the live depth controller settle within +-1 of a sweep's best depth within 20 iterations?

Issue #14 asks of the per-client draft-depth controller (:mod:`runtime.split.depth`, ``runtime.edge
--depth auto``) that it "applies the calibration rule and settles within +-1 of the best depth of a
sweep within 20 iterations". ``tests/test_split_depth_controller.py`` checks it against a
discrete-event simulation's sweep; this experiment checks it on the live runtime: the split server
and the edge process over loopback, as ``experiments.split_bench`` runs them.

    python -m experiments.depth_settle --out results/depth_settle
    python -m experiments.depth_settle --out /tmp/ds --preset tiny --rtt-ms 5 --depths 1,2 --max-new-tokens 16 --repeats 1  # a smoke run
    python -m experiments.depth_settle --out /tmp/ds_t1 --temperature 1 --seeds per-repeat --requests 4 --max-new-tokens 128 --repeats 3
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

import numpy as np
import pandas as pd

from agents.artefacts import save_figure_atomic, write_csv_atomic, write_text_atomic
from experiments import split_bench
from experiments.sweep_best import near_any, paired_best, paired_ratio

SETTLE_ITERATIONS = 20  #: the issue's horizon: the controller may roam this many iterations
BAND = 1  #: the issue's tolerance: within +-1 of the sweep's best depth
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
    bench = split_bench.parse_args(["--out", str(own.out), "--rtt-ms", own.rtt_ms, "--clients", str(own.clients), "--cohorts", str(own.cohorts),
                                    "--proactive", own.proactive, "--requests", str(own.requests), "--max-new-tokens", str(own.max_new_tokens),
                                    "--repeats", str(own.repeats), *rest])
    return own, bench


def client_traces(logs: Sequence[dict], max_new_tokens: int) -> dict[int, list[tuple[int, bool]]]:
    """Each client's iterations in order (request ``c{i}r{k}``: client i's k-th request), as
    (drafted depth, capped): ``capped`` where the token limit set the depth (``runtime.split.edge_client``
    drafts ``min(controller's depth, tokens left - 1)``: depth = tokens left - 1), not the controller."""
    keyed: dict[int, list[tuple[int, int, int, int]]] = {}
    for log in logs:
        client, _, request = log["request_id"].lstrip("c").partition("r")
        keyed.setdefault(int(client), []).append((int(request), int(log["iteration"]), int(log["depth"]), int(log["emitted"])))
    traces = {}
    for client, rows in sorted(keyed.items()):
        trace, emitted, last = [], 0, None
        for request, _, depth, new in sorted(rows):
            emitted = 0 if request != last else emitted
            trace.append((depth, depth == max_new_tokens - emitted - 1))
            emitted, last = emitted + new, request
        traces[client] = trace
    return traces


def settled_after(trace: Sequence[int], best: int | Sequence[int], band: int = BAND) -> int | None:
    """How many leading iterations of ``trace`` come before the last stretch within ``best +- band``
    that runs to its end (0: every iteration is in the band); None when its last iteration is not.
    ``best`` may be several depths (the sweep's tied depths): within ``band`` of any of them."""
    centres = [best] if isinstance(best, int) else list(best)
    i = len(trace)
    while i > 0 and near_any(trace[i - 1], centres, band):
        i -= 1
    return i if i < len(trace) else None


def best_depth(sweep: pd.DataFrame) -> tuple[int, float, list[int]]:
    """The fixed depth of lowest mean ITL, that ITL (ms), and the depths whose runs' ITL range
    overlaps the best's (the best included)."""
    by = sweep.groupby("depth").itl_ms.agg(["mean", "min", "max"])
    best = int(by["mean"].idxmin())
    lo, hi = by.loc[best, "min"], by.loc[best, "max"]
    tied = sorted(int(d) for d, row in by.iterrows() if row["min"] <= hi and row["max"] >= lo)
    return best, float(by.loc[best, "mean"]), tied


def assess(sweep: pd.DataFrame, traces: pd.DataFrame, requests: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per RTT and auto-run client trace: the sweep's best depth and the trace's settling.

    With ``requests`` (one row per run and request: ``requests.csv``) the best depth, the tied
    depths and the controller's ITL ratio come from the paired bootstrap over texts
    (:mod:`experiments.sweep_best`); without (runs recorded before it) from the runs' mean ITLs,
    ties by overlapping ITL ranges and no interval."""
    rows = []
    for rtt, fixed in sweep[sweep.depth != "auto"].groupby("rtt_ms"):
        auto = sweep[(sweep.rtt_ms == rtt) & (sweep.depth == "auto")]
        if requests is not None:
            mine = requests[requests.rtt_ms == rtt]
            fixed_texts = mine[mine.depth != "auto"].assign(depth=lambda d: d.depth.astype(int))
            found = paired_best(fixed_texts)
            best, best_itl, tied, p_best, texts = found.best, found.best_itl_ms, found.tied, found.p_best[found.best], found.texts
            ratio, low, high, _ = paired_ratio(mine[mine.depth == "auto"], fixed_texts[fixed_texts.depth == best])
        else:
            best, best_itl, tied = best_depth(fixed.assign(depth=fixed.depth.astype(int)))
            p_best, texts, ratio, low, high = float("nan"), None, auto.itl_ms.mean() / best_itl, float("nan"), float("nan")
        for (repeat, client), t in traces[traces.rtt_ms == rtt].groupby(["repeat", "client"]):
            trace = t[~t.capped.astype(bool)].sort_values("position").depth.tolist()  # the controller's choices only
            after, after_tied = settled_after(trace, best), settled_after(trace, tied)
            late = trace[SETTLE_ITERATIONS:]
            too_short = len(trace) <= SETTLE_ITERATIONS
            rows.append({"rtt_ms": rtt, "repeat": repeat, "client": client, "best_depth": best, "best_itl_ms": best_itl,
                         "p_best": p_best, "texts": texts, "tied_depths": " ".join(map(str, tied)), "iterations": len(trace),
                         "settled_after": after, "too_short": too_short,
                         "met": (not too_short) and after is not None and after <= SETTLE_ITERATIONS,
                         "met_tied": (not too_short) and after_tied is not None and after_tied <= SETTLE_ITERATIONS,
                         "in_band_after_20": float(np.mean([abs(d - best) <= BAND for d in late])) if late else float("nan"),
                         "mean_depth_after_20": float(np.mean(late)) if late else float("nan"),
                         "depth_at_20": trace[SETTLE_ITERATIONS] if not too_short else None,
                         "auto_itl_ms": float(auto[auto.repeat == repeat].itl_ms.mean()),
                         "auto_vs_best_itl": ratio, "auto_vs_best_low": low, "auto_vs_best_high": high,
                         "trace": " ".join(map(str, trace))})
    return pd.DataFrame(rows)


def by_rtt(result: pd.DataFrame) -> pd.DataFrame:
    """One row per RTT: the sweep's best depth, how many traces met the target (``traces_met``:
    within +-1 of the best depth; ``traces_met_tied``: of some depth tied with it), and what the
    controller's depths cost against the best fixed depth (``auto_vs_best_itl``: ITL ratio, with its
    95 % paired bootstrap interval when the run recorded its requests)."""
    rows = []
    for rtt, r in result.groupby("rtt_ms"):
        judged, first = r[~r.too_short], r.iloc[0]
        ratio = first.auto_vs_best_itl if "auto_vs_best_itl" in r else r.auto_itl_ms.mean() / first.best_itl_ms
        has_ci = "auto_vs_best_low" in r and np.isfinite(first.auto_vs_best_low)
        row = {"rtt_ms": rtt, "best_depth": int(first.best_depth)}
        if "p_best" in r and np.isfinite(first.p_best):
            row |= {"texts": int(first.texts), "p_best": first.p_best}
        row |= {"tied_depths": first.tied_depths, "traces_met": f"{int(judged.met.sum())} of {len(judged)}"}
        if "met_tied" in r:
            row["traces_met_tied"] = f"{int(judged.met_tied.sum())} of {len(judged)}"
        row |= {  # the slowest trace's settling (never: some trace ends outside the band)
            "settled_after_worst": "never" if judged.settled_after.isna().any() else int(judged.settled_after.max()),
            "mean_depth_after_20": judged.mean_depth_after_20.mean(), "in_band_after_20": judged.in_band_after_20.mean(),
            "auto_vs_best_itl": f"{ratio:.3g} [{first.auto_vs_best_low:.3g}, {first.auto_vs_best_high:.3g}]" if has_ci else ratio}
        rows.append(row)
    return pd.DataFrame(rows)


def run(own: argparse.Namespace, bench: argparse.Namespace) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Every (repeat, RTT, depth) run; returns the per-run table, the auto runs' iterations and the
    per-request table (one row per run and request: its text's key and ITL)."""
    runs, iterations, texts = [], [], []
    grid = [(r, rtt, d) for r in range(own.repeats) for rtt in bench.rtt_ms for d in [*map(str, own.depths), "auto"]]
    for k, (repeat, rtt, depth) in enumerate(grid, 1):
        folder = own.out / "runs" / f"rtt{rtt:g}_depth-{depth}_repeat{repeat}"
        folder.mkdir(parents=True, exist_ok=True)
        load, t0 = os.getloadavg()[0], time.perf_counter()
        seed = repeat if own.seeds == "per-repeat" else 0
        result = split_bench.split_run(argparse.Namespace(**{**vars(bench), "depth": depth}), rtt, own.proactive, own.cohorts, own.clients, folder,
                                      edge_flags=["--temperature", str(own.temperature), "--seed", str(seed)])
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


def markdown(own: argparse.Namespace, bench: argparse.Namespace, cmd: str, sweep: pd.DataFrame, result: pd.DataFrame, load: str) -> str:
    """The report; ``load``: a sentence on the host's load while the runs ran."""
    fixed = sweep[sweep.depth != "auto"].assign(depth=lambda d: d.depth.astype(int))
    curve = fixed.pivot_table(index="depth", columns="rtt_ms", values="itl_ms", aggfunc="mean")
    curve.columns = [f"ITL ms at {c:g} ms RTT" for c in curve.columns]
    met, counted = int(result.met.sum()), int((~result.too_short).sum())
    paired = "p_best" in result and result.p_best.notna().any()
    tied_rule = ("fixed depths whose paired ITL difference to the best has a 95 % bootstrap interval (over the texts) that reaches 0" if paired
                 else "fixed depths whose runs' ITL range overlaps the best's")
    lines = [
        "# The live depth controller against a depth sweep",
        "",
        f"Command: `{cmd}`",
        "",
        f"Pair: {'path ' + str(bench.pair) if bench.pair else bench.preset}, {bench.device} {bench.dtype}; {own.clients} edge client(s), "
        f"{own.cohorts} cohort(s), proactive drafting {own.proactive}, {'greedy' if own.temperature == 0 else f'sampling at temperature {own.temperature:g}'}, {own.requests} request(s) x {own.max_new_tokens} tokens per client, "
        f"jitter {bench.jitter_ms:g} ms, {bench.bandwidth_mbps:g} Mbit/s, batching window {bench.window_ms:g} ms; "
        f"{'server and edge pinned to a core each' if bench.cpu_pair else 'processes not pinned'}; {own.repeats} repeat(s) of the whole grid"
        f"{', each with its own edge seed (new texts)' if own.seeds == 'per-repeat' else ', every run with edge seed 0 (the repeats re-measure the same texts)'}. "
        f"Host: {os.cpu_count()} CPUs; {load} (per run: sweep.csv).",
        "",
        f"**Target** (issue #14): the controller settles within +-{BAND} of the sweep's best depth within {SETTLE_ITERATIONS} iterations. "
        f"Met by **{met} of {counted}** client traces long enough to judge"
        + (f" ({int(result.too_short.sum())} too short)" if result.too_short.any() else "") + "."
        + (f" Within +-{BAND} of some depth the sweep cannot tell from the best (`tied_depths`): **{int(result.met_tied.sum())} of {counted}**."
           if "met_tied" in result else ""),
        "",
        f"`tied_depths`: {tied_rule}."
        + (" `texts`: the texts (seed, client, request) served at every depth; `p_best`: the share of bootstrap resamples of them in "
           "which `best_depth` is the best. Under sampling a run's ITL depends on the text it drew, so the texts, not the runs, are "
           "the evidence (`experiments/sweep_best.py`)." if paired else ""),
        "",
        "## By RTT",
        "",
        by_rtt(result).to_markdown(index=False, floatfmt=".3g"),
        "",
        "## The sweep (mean ITL over the repeats, fixed depths)",
        "",
        curve.to_markdown(floatfmt=".2f"),
        "",
        "## The controller (`--depth auto`), one row per client trace",
        "",
        "`settled_after`: leading iterations before the trace stays within +-1 of `best_depth` to its end (empty: it ends outside); "
        "`met_tied`: within +-1 of some tied depth from iteration 20 on; `trace`: the depth of every iteration.",
        "",
        result.drop(columns=[c for c in ("too_short", "auto_vs_best_itl", "auto_vs_best_low", "auto_vs_best_high", "p_best", "texts")
                             if c in result]).to_markdown(index=False, floatfmt=".3g"),
        "",
    ]
    return "\n".join(lines)


def plot(sweep: pd.DataFrame, result: pd.DataFrame, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rtts = sorted(result.rtt_ms.unique())
    fig, axes = plt.subplots(2, len(rtts), figsize=(4.2 * len(rtts), 6.5), squeeze=False)
    for j, rtt in enumerate(rtts):
        mine = result[result.rtt_ms == rtt]
        best = int(mine.best_depth.iloc[0])
        ax = axes[0, j]
        ax.axhspan(best - BAND - 0.5, best + BAND + 0.5, color="tab:green", alpha=0.15, label=f"best {best} +- {BAND}")
        ax.axvline(SETTLE_ITERATIONS, color="grey", ls="--", lw=1)
        for _, row in mine.iterrows():
            trace = [int(d) for d in str(row["trace"]).split()]
            ax.step(range(len(trace)), trace, where="post", lw=1, label=f"client {row['client']}, repeat {row['repeat']}")
        ax.set(title=f"RTT {rtt:g} ms", xlabel="iteration", ylabel="draft depth")
        ax.legend(fontsize=7)
        fixed = sweep[(sweep.rtt_ms == rtt) & (sweep.depth != "auto")].assign(depth=lambda d: d.depth.astype(int))
        by = fixed.groupby("depth").itl_ms.agg(["mean", "min", "max"])
        ax = axes[1, j]
        ax.errorbar(by.index, by["mean"], yerr=[by["mean"] - by["min"], by["max"] - by["mean"]], marker="o", capsize=3)
        auto = sweep[(sweep.rtt_ms == rtt) & (sweep.depth == "auto")].itl_ms
        ax.axhline(auto.mean(), color="tab:red", ls=":", label="auto (mean)")
        ax.set(xlabel="fixed depth", ylabel="ITL, ms")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return save_figure_atomic(fig, path)


def report(folder: Path) -> str:
    """Rebuild ``depth_settle.csv``, ``.md`` and ``.png`` of a finished run from its ``sweep.csv`` and
    ``traces.csv`` with this code (the run's settings: the command its markdown records)."""
    md_path = folder / "depth_settle.md"
    first = md_path.read_text().split("Command: `", 1)[1].split("`", 1)[0] if md_path.is_file() else ""
    if not first.startswith("python -m experiments.depth_settle"):
        raise SystemExit(f"--report needs a finished run's folder (depth_settle.md naming its command), got {str(folder)!r}")
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
    load0 = os.getloadavg()[0]
    sweep, traces, texts = run(own, bench)
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
