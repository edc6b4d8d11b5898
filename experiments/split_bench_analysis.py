"""The analysis of ``experiments.split_bench``: from its raw runs to the comparison and the targets.

The benchmark (:mod:`experiments.split_bench`) starts the processes and measures; this module only
reads what they left: the edge's iteration log (:func:`cohort_alternation`,
:func:`drafted_hit_rate`), one run's row (:func:`run_row`), a cell's repeats averaged
(:func:`cell_means`), the server-only SD configuration it is
compared with at equal ITL (:func:`best_baseline`, :func:`compare`, under every throughput
definition of :data:`THROUGHPUT`), the sweeps a run is paired with in time
(:func:`paired_baseline`, :func:`mean_sweep`, :func:`with_paired_ratio`), the headline run (:func:`best_split`), the target lines of the
markdown (:func:`checks`) and the markdown itself (:func:`markdown`). Kept apart so the comparison can be checked on synthetic rows, without
models or processes. The definitions are in :mod:`experiments.split_bench`'s docstring.
"""

from __future__ import annotations

import json
import os
from numbers import Real

import pandas as pd

#: throughput definition -> (split column, baseline column)
THROUGHPUT = {"cpu": ("server_tokens_per_cpu_s", "tokens_per_cpu_s"), "busy": ("server_tokens_per_busy_s", "tokens_per_s"),
              "wall": ("server_tokens_per_s", "tokens_per_s")}

THROUGHPUT_WORDS = {"cpu": "tokens per CPU second of the server process while serving (server-only SD: per CPU second of its process).",
                    "busy": "tokens per second inside the server's verification forwards (server-only SD: per wall second).",
                    "wall": "tokens per wall second of the server's span (server-only SD: per wall second)."}


def cohort_alternation(logs: list[dict]) -> float | None:
    """Of consecutive verification batches (rebuilt from the edge's iteration log: a batch is the
    iterations with one cohort and one server start time), the fraction that switch cohort: ~1
    when two cohorts take turns (one verifies while the other drafts and travels), 0 with one."""
    starts = sorted({(round(x["arrived_at"] + x["queue_wait_ms"] / 1e3, 4), x["cohort"]) for x in logs})
    cohorts = [c for _, c in starts]
    return sum(a != b for a, b in zip(cohorts[:-1], cohorts[1:], strict=True)) / (len(cohorts) - 1) if len(cohorts) > 1 else None


def drafted_hit_rate(logs: list[dict]) -> float | None:
    """Proactive hits among the iterations that drafted ahead at all (``proactive_ms`` > 0) and had
    a next block (not a request's last): on a shared draft device a client often gets no turn
    before its reply, which the plain hit rate counts as a miss."""
    last = {}
    for x in logs:
        last[x["request_id"]] = max(last.get(x["request_id"], -1), x["iteration"])
    drafted = [x["proactive_hit"] for x in logs if x["proactive_ms"] > 0 and x["iteration"] < last[x["request_id"]]]
    return sum(drafted) / len(drafted) if drafted else None


def best_baseline(base: pd.DataFrame, itl_ms: float, column: str = "tokens_per_s") -> tuple[pd.Series, bool]:
    """The baseline configuration with the most ``column`` among those whose ITL is within
    ``itl_ms`` (and True), else the lowest-ITL one (and False)."""
    ok = base[base.itl_ms <= itl_ms]
    if len(ok):
        return ok.loc[ok[column].idxmax()], True
    return base.loc[base.itl_ms.idxmin()], False


def best_split(df: pd.DataFrame) -> pd.Series:
    """The headline configuration: among the runs at the first (smallest) RTT, the one with the
    highest throughput_ratio -- each run's ratio is against the best server-only SD configuration
    whose ITL is no worse than that run's own (equal ITL, the baseline's side of the tie)."""
    five = df[df.rtt_ms == df.rtt_ms.min()]
    return five.loc[five.throughput_ratio.idxmax()]


def checks(df: pd.DataFrame) -> list[str]:
    """The markdown's target lines: the headline ratio at the first RTT (with the paired ratio where
    ``df`` has ``throughput_ratio_paired``), how many cells there reach 1.15x and the best per client
    count, proactive on vs off per cell and their tally, two cohorts vs one per cell and their tally."""
    lines = []
    five = df[df.rtt_ms == df.rtt_ms.min()]
    if len(five):
        best = best_split(df)
        name = f" ({best.throughput} throughput)" if "throughput" in five else ""
        others = ", ".join(f"{c[6:]} {best[c]:.2f}x" for c in ("ratio_cpu", "ratio_busy", "ratio_wall") if c in five)
        config = (f" ({int(best.clients)} clients, {int(best.cohorts)} cohort(s), proactive {best.proactive}; ITL {best.itl_ms:.2f} ms vs the "
                  f"baseline's {best.baseline_itl_ms:.2f} ms at batch {int(best.baseline_batch)}, gamma {int(best.baseline_gamma)})") if "baseline_itl_ms" in five else ""
        paired = (f"; paired in time (each run against the sweeps either side of its repeat): {best.throughput_ratio_paired:.2f}x, runs "
                  f"{best.throughput_ratio_paired_min:.2f}-{best.throughput_ratio_paired_max:.2f}x") if "throughput_ratio_paired" in five else ""
        lines.append(f"- split vs server-only SD at equal ITL, RTT {five.rtt_ms.iloc[0]:g} ms: best throughput ratio{name} {five.throughput_ratio.max():.2f}x "
                     f"(target >= 1.15x){config}" + (f"; same run by definition: {others}" if others else "") + paired)
        tally = f"- split vs server-only SD, all cells at RTT {five.rtt_ms.iloc[0]:g} ms: >= 1.15x in {int((five.throughput_ratio >= 1.15).sum())} of {len(five)}"
        if "throughput_ratio_paired" in five:
            tally += f" ({int((five.throughput_ratio_paired >= 1.15).sum())} by the paired ratio)"
        if "clients" in five:
            per = five.groupby("clients").throughput_ratio.max()
            tally += "; the best cell per client count: " + ", ".join(f"{int(n)} -> {r:.2f}x" for n, r in per.items())
        lines.append(tally)
    keys = ["rtt_ms", "clients"] if "clients" in df else ["rtt_ms"]
    gains = []
    for key, g in df.groupby([*keys, "cohorts"]):
        on, off = g[g.proactive == "on"], g[g.proactive == "off"]
        if len(on) and len(off):
            gain = 1 - on.itl_ms.iloc[0] / off.itl_ms.iloc[0]
            gains.append(gain)
            who = f", {key[1]} clients" if len(keys) == 2 else ""
            lines.append(f"- proactive on vs off, RTT {key[0]:g} ms{who}, {key[-1]} cohort(s): ITL {on.itl_ms.iloc[0]:.2f} vs {off.itl_ms.iloc[0]:.2f} ms, "
                         f"{100 * gain:.1f} % lower (target >= 5 %)")
    if gains:
        lines.append(f"- proactive on vs off, all cells: ITL >= 5 % lower in {sum(g >= 0.05 for g in gains)} of {len(gains)}")
    cohort_cells = []  #: (ratio, ceiling) per cell
    for key, g in df.groupby([*keys, "proactive"]):
        one, two = g[g.cohorts == 1], g[g.cohorts == 2]
        if len(one) and len(two):
            who = f", {key[1]} clients" if len(keys) == 2 else ""
            u1, u2 = one.server_utilisation.iloc[0], two.server_utilisation.iloc[0]
            cohort_cells.append((u2 / u1, 1 / u1))
            # a utilisation cannot pass 1: one cohort's u1 caps what a second can add at 1 / u1
            lines.append(f"- two cohorts vs one, RTT {key[0]:g} ms{who}, proactive {key[-1]}: server utilisation {u2:.2f} vs "
                         f"{u1:.2f} = {u2 / u1:.2f}x (target >= 1.5x; at most 1/{u1:.2f} = {1 / u1:.2f}x)")
    if cohort_cells:
        open_cells = [r for r, ceiling in cohort_cells if ceiling >= 1.5]
        lines.append(f"- two cohorts vs one, all cells: >= 1.5x in {sum(r >= 1.5 for r, _ in cohort_cells)} of {len(cohort_cells)}; "
                     f"the ceiling 1/u1 reaches 1.5x in {len(open_cells)} of them, and the target is met in {sum(r >= 1.5 for r in open_cells)} of those")
    return lines


#: how the edge's clients draft on its one device, per ``--shared-device``, for the results' header
EDGE_DRAFTING = {"auto": "batched when the draft allows (`--shared-device auto`)", "batched": "in one batched forward per step",
                 "on": "one after another", "off": "concurrently, each with the model's own forward"}


def markdown(args, cmd: str, df: pd.DataFrame, base: pd.DataFrame, sweeps: int, load: tuple[float, float]) -> list[str]:
    """The lines of ``split_bench.md``: the command, the setting, the target lines (:func:`checks`)
    and both tables; ``df`` the cells (compared), ``base`` the server-only sweep, ``sweeps`` how many
    sweeps it averages, ``load`` the host's 1-minute load average at the start and the end."""
    return ["# Split runtime benchmark (loopback)", "", f"Command: `{cmd}`", "",
            f"Pair: {args.pair or args.preset}; server {args.device} {args.dtype}, edge {args.edge_device or args.device} {args.edge_dtype or args.dtype}; {'/'.join(map(str, args.clients))} edge clients at RTT {args.rtt_ms[0]:g} ms ({'/'.join(map(str, args.sweep_clients))} at the other RTTs) x {args.requests} requests x {args.max_new_tokens} tokens, {args.repeats} run(s) of every cell (its mean); "
            f"batching window {args.window_ms:g} ms, edge clients {EDGE_DRAFTING[args.shared_device]} on one draft device"
            f" (proactive priority `{args.proactive_priority}`; depth {args.depth}, controller probes `{args.depth_probe}`); "
            f"jitter {args.jitter_ms:g} ms, {args.bandwidth_mbps:g} Mbit/s; one torch thread per process; "
            + (f"server and server-only SD pinned to CPU {args.cpu_pair[0]}, edge to CPU {args.cpu_pair[1]} (`--pin-cpus on`: each side on a core "
               "of its own, as on a testbed of two devices)." if args.cpu_pair else "processes not pinned (`--pin-cpus off`: the edge and the server share the cores)."), "",
            f"Host: {os.cpu_count()} CPUs, load average (1 min) {load[0]:.1f} at the start and {load[1]:.1f} at the end "
            "(per run: host_load_1min); "
            + (f"server-only SD from `--baseline {args.baseline}` (given, not swept here: throughput_ratio and throughput_ratio_paired use it alike)."
               if args.baseline else f"server-only SD swept {sweeps} times (before every repeat of the grid and after the last) and averaged for the "
               "cells' throughput_ratio; throughput_ratio_paired is the mean of the cell's runs' ratios, each against the sweeps either side of its "
               "repeat (split_bench_runs.csv, baseline_sweeps.csv)."), "",
            f"Server throughput (throughput_ratio): **{args.throughput}** -- {THROUGHPUT_WORDS[args.throughput]} ratio_cpu, ratio_busy and "
            "ratio_wall give the split/server-only ratio under each definition (the module docstring defines them).", "",
            f"Headline (equal ITL): of the runs at RTT {args.rtt_ms[0]:g} ms (every client count, proactive and cohort setting), the one with the highest "
            "throughput_ratio, each run against the best server-only SD configuration whose ITL is no worse than its own.", "",
            "## Targets", "", *checks(df), "",
            "## Split runs", "", df.drop(columns=["outcomes"]).to_markdown(index=False, floatfmt=".3g"), "",
            "## Server-only SD (one process drafts and verifies)", "", base.to_markdown(index=False, floatfmt=".3g"), ""]


def run_row(args, rtt: float, proactive: str, cohorts: int, clients: int, run: dict) -> dict:
    """One split run's measurements (before the comparison with the baseline)."""
    edge, server = run["edge"], run["server"]
    busy, cpu = server.get("busy_s"), server.get("cpu_s")
    timing = server.get("verify_timing") or {}
    return {"rtt_ms": rtt, "proactive": proactive, "cohorts": cohorts, "clients": clients, "depth": args.depth,
            "server_tokens_per_s": server["tokens_per_s"], "server_tokens_per_busy_s": server["tokens"] / busy if busy else float("nan"),
            "server_tokens_per_cpu_s": server["tokens"] / cpu if cpu else float("nan"),
            "server_cpu_s": cpu, "server_busy_s": busy, "itl_ms": edge["itl_ms"], "server_utilisation": server["utilisation"],
            "mean_batch": server["mean_batch"], "cohort_alternation": server["cohort_alternation"], "mean_depth": edge["mean_depth"],
            "accepted_per_iteration": edge["accepted_per_iteration"], "proactive_hit_rate": edge["proactive_hit_rate"], "network_ms": edge["network_ms"],
            # what the round trip took beyond the emulated WAN (mean RTT + mean jitter both ways): gRPC, serialisation, threads
            "transport_overhead_ms": edge["network_ms"] - rtt - args.jitter_ms, "queue_wait_ms": edge["queue_wait_ms"],
            "server_compute_ms": edge["server_compute_ms"],
            # where the server's CPU goes: the batcher thread's CPU inside verification / the process's serving CPU (the rest:
            # gRPC, (de)serialisation, thread handoffs); within verification the forward's share and how often a batch kept its cache
            "verify_cpu_share": server["verify_cpu_s"] / cpu if cpu and server.get("verify_cpu_s") is not None else float("nan"),
            "forward_share": timing["forward_s"] / busy if busy and "forward_s" in timing else float("nan"),
            "kv_reused": timing["reused"] / (timing["reused"] + timing["stacked"]) if timing.get("reused", 0) + timing.get("stacked", 0) else float("nan"),
            "proactive_hit_rate_drafted": server.get("proactive_hit_rate_drafted"),
            "draft_ms": server.get("draft_ms"), "device_wait_ms": server.get("device_wait_ms"),
            "host_load_1min": run["load"], "outcomes": json.dumps(edge["outcomes"])}


#: what names a cell of the grid (its repeats share it)
CELL = ("rtt_ms", "proactive", "cohorts", "clients", "depth")
#: measurements whose spread over a cell's repeats is reported beside their mean
SPREAD = ("itl_ms", "server_utilisation")


def _numbers(values: list) -> list[float]:
    """The real numbers among ``values`` (numpy's too; a bool as 0 / 1), without NaN and None."""
    return [float(v) for v in values if isinstance(v, Real) and v == v]  # v == v: not NaN


def cell_means(rows: list[dict]) -> list[dict]:
    """One row per cell of the grid (:data:`CELL`): the mean of its repeats' measurements, in the
    order the cells first ran, with ``repeats`` (how many runs), ``*_min`` / ``*_max`` of
    :data:`SPREAD` and ``outcomes`` summed over the repeats. Why the mean of repeats and not one
    run: a single run of a cell is ~15 s of serving, and the same cell's ITL has moved by 20 % from
    one run to the next on this shared host (the proactive on/off sign flipped between two runs)."""
    cells: dict[tuple, list[dict]] = {}
    for row in rows:
        cells.setdefault(tuple(row[k] for k in CELL), []).append(row)
    out = []
    for runs in cells.values():
        cell = {k: runs[0][k] for k in CELL}
        for key in runs[0]:
            if key in CELL or key in ("outcomes", "repeat"):
                continue
            values = [r[key] for r in runs]
            numbers = _numbers(values)
            # a number's mean over the runs that have one (a bool's: the share of True); text from the first run
            cell[key] = sum(numbers) / len(numbers) if numbers else (values[0] if not isinstance(values[0], Real) else float("nan"))
        for key in SPREAD:
            numbers = _numbers([r[key] for r in runs])
            cell[f"{key}_min"], cell[f"{key}_max"] = (min(numbers), max(numbers)) if numbers else (float("nan"), float("nan"))
        outcomes: dict[str, int] = {}
        for r in runs:
            for name, n in json.loads(r["outcomes"]).items():
                outcomes[name] = outcomes.get(name, 0) + n
        out.append({**cell, "repeats": len(runs), "outcomes": json.dumps(outcomes)})
    return out


def mean_sweep(sweeps: list[pd.DataFrame]) -> pd.DataFrame:
    """The mean of server-only SD sweeps, per (batch, gamma)."""
    frames = [s.drop(columns=["sweep"], errors="ignore") for s in sweeps]
    return pd.concat(frames).groupby(["batch", "gamma"], as_index=False).mean()


def paired_baseline(sweeps: list[pd.DataFrame], repeat: int) -> pd.DataFrame:
    """The baseline a run of repeat ``repeat`` is paired with in time: the mean of the sweeps just
    before and just after its repeat (``sweeps[repeat]`` and ``sweeps[repeat + 1]``, as
    ``experiments.split_bench`` sweeps before every repeat and after the last); a single given
    sweep (``--baseline``) pairs with every run (its mean per configuration, as for the cells)."""
    if len(sweeps) == 1:
        return mean_sweep(sweeps)
    if not 0 <= repeat < len(sweeps) - 1:
        raise ValueError(f"repeat {repeat} has no sweeps either side of it ({len(sweeps)} sweeps)")
    return mean_sweep(sweeps[repeat : repeat + 2])


def with_paired_ratio(cells: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """``cells`` with ``throughput_ratio_paired`` (``_min``, ``_max``): the mean (and range) over each
    cell's runs of their ratio against the sweeps either side of their repeat (``runs``, compared
    with :func:`paired_baseline`). A cell's own ``throughput_ratio`` compares its mean with the mean
    of all sweeps; the two differ where the host's speed drifted between repeats, and also because
    each run is matched with the baseline configuration at its own ITL and a mean of ratios is not
    the ratio of the means."""
    stats = runs.groupby(list(CELL)).throughput_ratio.agg(["mean", "min", "max"])
    stats.columns = ["throughput_ratio_paired", "throughput_ratio_paired_min", "throughput_ratio_paired_max"]
    return cells.merge(stats.reset_index(), on=list(CELL), how="left")


def compare(row: dict, base: pd.DataFrame, throughput: str) -> dict:
    """``row`` with the best baseline at its ITL and the split/server-only ratios under every definition."""
    ratios = {}
    for name, (split_col, base_col) in THROUGHPUT.items():
        best, _ = best_baseline(base, row["itl_ms"], base_col)
        ratios[f"ratio_{name}"] = row[split_col] / best[base_col]
    ref, within = best_baseline(base, row["itl_ms"], THROUGHPUT[throughput][1])
    return {**row, "baseline_tokens_per_s": ref.tokens_per_s, "baseline_tokens_per_cpu_s": ref.tokens_per_cpu_s, "baseline_itl_ms": ref.itl_ms,
            "baseline_batch": int(ref.batch), "baseline_gamma": int(ref.gamma), "baseline_within_itl": within,
            "throughput": throughput, "throughput_ratio": ratios[f"ratio_{throughput}"], **ratios}
