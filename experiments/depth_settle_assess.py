"""The judgement of ``experiments.depth_settle``: each client's depth trace against the sweep's
best depth (issue #14: "settles within +-1 of the best depth of a sweep within 20 iterations").
The rules are in :mod:`experiments.depth_settle`'s docstring; the sweep's statistics in
:mod:`experiments.sweep_best`."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from experiments.sweep_best import near_any, paired_best, paired_ratio

SETTLE_ITERATIONS = 20  #: the issue's horizon: the controller may roam this many iterations
BAND = 1  #: the issue's tolerance: within +-1 of the sweep's best depth


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
