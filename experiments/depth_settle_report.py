"""The report of ``experiments.depth_settle``: its markdown and its figure (the depth traces over
the band of the sweep's best depth; the sweep's ITL curve against the controller's)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pandas as pd

from agents.artefacts import save_figure_atomic
from experiments.depth_settle_assess import BAND, SETTLE_ITERATIONS, by_rtt


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
        f"Controller (`--depth auto`): probes {bench.depth_probe}, hold {own.depth_hold:g} (0: off), memory {own.depth_memory:g}"
        + (f"; the fixed-depth runs are those of `{own.sweep_from}` (`--sweep-from`: the same settings and texts), only the controller ran here"
           if own.sweep_from is not None else "") + ".",
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
