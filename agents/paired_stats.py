"""Paired comparisons: two schedulers on the same rounds, judged by their per-round difference.

Every scheduler plans the same rounds, so the right question is not whether two per-scheduler
confidence intervals overlap but how the per-round difference ``a_r - b_r`` is distributed: the
rounds' own difficulty cancels out, and a difference far smaller than either CI can be certain.

* the mean difference with a bootstrap 95 % CI (``scipy.stats.bootstrap``, BCa, resampling rounds;
  seeded, so tables regenerate identically);
* the **Wilcoxon signed-rank** test (two-sided; rounds with a zero difference are dropped, the
  ``wilcox`` convention), which assumes no normality of the differences.

Across training seeds (few values, each a mean over many rounds) :func:`t_interval` gives the
Student-t 95 % CI of the mean.
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats

CONFIDENCE = 0.95
RESAMPLES = 9999
TEST_NAME = "Wilcoxon signed-rank (two-sided)"


@dataclass(frozen=True)
class PairedDifference:
    """Mean of ``a - b`` over paired samples, its bootstrap CI and the Wilcoxon signed-rank p-value."""

    mean: float
    ci_low: float
    ci_high: float
    p_value: float
    n: int

    def as_dict(self, prefix: str = "") -> dict[str, float]:
        return {f"{prefix}{k}": v for k, v in asdict(self).items()}


def paired_difference(a: np.ndarray, b: np.ndarray, seed: int = 0) -> PairedDifference:
    """Compare ``a`` and ``b`` (same length, paired by position: the same rounds)."""
    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired samples must be 1-D arrays of equal length, got shapes {a.shape} and {b.shape}")
    d = a - b
    n = len(d)
    if n == 0:
        return PairedDifference(np.nan, np.nan, np.nan, np.nan, 0)
    mean = float(d.mean())
    if n < 2 or np.all(d == d[0]):
        # no spread: every resample has the same mean (BCa is undefined); no test is possible if all zero
        lo = hi = mean
        p = 1.0 if np.all(d == 0) else (float(stats.wilcoxon(d).pvalue) if n >= 2 else np.nan)
        return PairedDifference(mean, lo, hi, p, n)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # BCa's degenerate-data warning: handled by the fallback below
        res = stats.bootstrap((d,), np.mean, confidence_level=CONFIDENCE, n_resamples=RESAMPLES, method="BCa", rng=np.random.default_rng(seed))
        lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
        if not (np.isfinite(lo) and np.isfinite(hi)):
            res = stats.bootstrap((d,), np.mean, confidence_level=CONFIDENCE, n_resamples=RESAMPLES, method="percentile", rng=np.random.default_rng(seed))
            lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
        p = float(stats.wilcoxon(d, zero_method="wilcox").pvalue) if np.any(d != 0) else 1.0
    return PairedDifference(mean, lo, hi, p, n)


def t_interval(x: np.ndarray) -> tuple[float, float]:
    """Mean of ``x`` and the half-width of its Student-t 95 % CI (NaN for fewer than two values)."""
    x = np.asarray(x, dtype=float)
    x = x[np.isfinite(x)]
    if len(x) == 0:
        return float("nan"), float("nan")
    if len(x) < 2:
        return float(x.mean()), float("nan")
    return float(x.mean()), float(stats.t.ppf(0.5 + CONFIDENCE / 2, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x)))
