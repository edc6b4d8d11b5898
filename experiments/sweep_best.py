"""Which fixed draft depth of a live sweep is best, and how sure the sweep can be: a paired
bootstrap over the texts the runs generated.

Under sampling a run's inter-token latency (ITL) depends as much on the text it happened to
generate as on its depth: a text whose drafts the target accepts more often needs fewer
iterations. Every depth of an ``experiments.depth_settle`` sweep serves the same requests (the same
prompt and sampling seed per client and request), so the texts pair the depths: the unit of
evidence is one text, not one run, and two runs of the same seed are one text measured twice
(their ITLs are averaged, they do not count twice).

- **best depth**: the depth of lowest mean per-text ITL;
- **tied depths**: the depths whose paired difference to the best (mean over texts of
  ``ITL(d) - ITL(best)``) has a bootstrap confidence interval that reaches 0 -- the sweep cannot
  tell them apart from the best (the best is among them);
- **p_best**: how often each depth is the argmin over bootstrap resamples of the texts;
- :func:`paired_ratio`: the controller's mean ITL over the best depth's on the same texts, with
  its bootstrap interval.

A sweep of greedy runs generates one text per prompt whatever the depth, so the same statistics
apply; the bootstrap then measures only the timing noise between the prompts' runs.

**Runs share a host's conditions.** The texts of one run share its host's speed, and each depth
is a run of its own, so a paired difference carries the two runs' host effects as well as the
texts'. On the 2-core host the server's mean compute per batch at one depth differed between
repeats of the same settings by more than depth 1 to 8 changes it within a repeat
(``results/depth_settle/temperature1_texts_after_fix/sweep.csv``, 20 ms RTT, depth 6: 20.2, 16.6 and
11.8 ms; within repeat 1, 12.2 ms at depth 1 and 15.7 ms at depth 8). So the bootstrap is two-stage by default
(``clusters="seed"``): it resamples the edge seeds (with ``--seeds per-repeat`` one seed is one
repeat, i.e. one run per depth), then the texts within each drawn seed. A texts-only bootstrap
(``clusters=None``, what this module did first) treats the texts as independent and, when the host
drifts, gives intervals that are too narrow. With a single seed (``--seeds fixed``, e.g. greedy
runs, whose repeats re-measure the same texts) the two coincide. With three seeds the cluster stage
has few distinct draws: read its intervals as rough, not exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

TEXT_KEY = ("seed", "client", "request")  #: columns that name one text (one request of one client under one edge seed)
RESAMPLES = 2000  #: bootstrap resamples
LEVEL = 0.95  #: confidence level of the intervals
CLUSTERS = "seed"  #: the bootstrap's first stage: resample these (None: texts only)


@dataclass(frozen=True)
class SweepBest:
    """What a sweep says about the best fixed depth (ITL in ms)."""

    best: int  #: the depth of lowest mean ITL over the texts
    best_itl_ms: float  #: that mean
    tied: list[int]  #: depths whose paired-difference interval with the best reaches 0 (the best included)
    p_best: dict[int, float]  #: share of bootstrap resamples in which each depth is the best
    texts: int  #: paired texts behind the figures


def per_text(requests: pd.DataFrame) -> pd.DataFrame:
    """Mean ITL per text (rows: :data:`TEXT_KEY`) and depth (columns); texts that some depth lacks
    (a request that did not finish, so no ITL) are left out, so every row pairs every depth."""
    missing = [c for c in (*TEXT_KEY, "depth", "itl_ms") if c not in requests.columns]
    if missing:
        raise ValueError(f"requests need the columns {[*TEXT_KEY, 'depth', 'itl_ms']}; missing {missing}")
    table = requests.dropna(subset=["itl_ms"]).pivot_table(index=list(TEXT_KEY), columns="depth", values="itl_ms", aggfunc="mean")
    return table.dropna()


def _resample_means(values: np.ndarray, resamples: int, seed: int, groups: np.ndarray | None = None) -> np.ndarray:
    """Column means of ``values`` (texts x depths) over bootstrap resamples of its rows; (resamples, depths).

    ``groups`` (texts,): a cluster label per row. With two or more clusters each resample first
    draws as many clusters as there are, with replacement, then as many rows of each drawn cluster
    as it has, with replacement (a two-stage bootstrap); otherwise rows are drawn alone."""
    rng = np.random.default_rng(seed)
    labels = np.unique(groups) if groups is not None else np.array([])
    if len(labels) < 2:
        idx = rng.integers(0, len(values), size=(resamples, len(values)))  # (resamples, texts)
        return values[idx].mean(axis=1)
    members = [np.flatnonzero(groups == g) for g in labels]
    out = np.empty((resamples, values.shape[1]))
    for r in range(resamples):
        drawn = rng.integers(0, len(members), size=len(members))
        rows = np.concatenate([rng.choice(members[c], size=len(members[c])) for c in drawn])
        out[r] = values[rows].mean(axis=0)
    return out


def _groups(table: pd.DataFrame, clusters: str | None) -> np.ndarray | None:
    """The cluster label of each row of a :func:`per_text` table (None: no cluster stage)."""
    if clusters is None:
        return None
    if clusters not in TEXT_KEY:
        raise ValueError(f"clusters must be one of {TEXT_KEY} or None, got {clusters!r}")
    return table.index.get_level_values(clusters).to_numpy()


def paired_best(requests: pd.DataFrame, resamples: int = RESAMPLES, level: float = LEVEL, seed: int = 0,
                clusters: str | None = CLUSTERS) -> SweepBest:
    """The sweep's best depth and the depths tied with it (``requests``: one row per text and fixed
    depth, the :data:`TEXT_KEY` columns, ``depth`` and ``itl_ms``; ``clusters``: the bootstrap's
    first stage, module docstring)."""
    table = per_text(requests)
    if table.empty:
        raise ValueError("no text was served at every depth: nothing to compare")
    depths = [int(d) for d in table.columns]
    values = table.to_numpy(dtype=float)  # (texts, depths)
    means = values.mean(axis=0)
    b = int(np.argmin(means))
    boot = _resample_means(values, resamples, seed, _groups(table, clusters))  # (resamples, depths)
    lower = np.quantile(boot - boot[:, [b]], (1 - level) / 2, axis=0)  # the paired difference's lower bound, per depth
    tied = sorted(d for d, lo in zip(depths, lower, strict=True) if lo <= 0.0)
    wins = np.bincount(boot.argmin(axis=1), minlength=len(depths)) / resamples
    return SweepBest(depths[b], float(means[b]), tied, {d: float(w) for d, w in zip(depths, wins, strict=True)}, len(values))


def paired_ratio(numerator: pd.DataFrame, denominator: pd.DataFrame, resamples: int = RESAMPLES, level: float = LEVEL,
                 seed: int = 0, clusters: str | None = CLUSTERS) -> tuple[float, float, float, int]:
    """``mean ITL(numerator) / mean ITL(denominator)`` over the texts both served, and its bootstrap
    interval (``clusters`` as in :func:`paired_best`): ``(ratio, low, high, texts)`` (NaNs and 0
    texts when they share none)."""
    both = pd.concat([per_text(numerator.assign(depth="a")), per_text(denominator.assign(depth="b"))], axis=1).dropna()
    if both.empty:
        return float("nan"), float("nan"), float("nan"), 0
    values = both.to_numpy(dtype=float)  # (texts, 2)
    boot = _resample_means(values, resamples, seed, _groups(both, clusters))
    ratios = boot[:, 0] / boot[:, 1]
    lo, hi = np.quantile(ratios, [(1 - level) / 2, (1 + level) / 2])
    return float(values[:, 0].mean() / values[:, 1].mean()), float(lo), float(hi), len(values)


def near_any(depth: int, depths: Sequence[int], band: int) -> bool:
    """Whether ``depth`` is within ``band`` of some depth of ``depths``."""
    return any(abs(depth - d) <= band for d in depths)
