"""Paired comparisons: two schedulers on the same rounds, judged by their per-round difference.

Every scheduler plans the same rounds, so the right question is not whether two per-scheduler
confidence intervals overlap but how the per-round difference ``a_r - b_r`` is distributed: the
rounds' own difficulty cancels out, and a difference far smaller than either CI can be certain.

* the mean difference with a bootstrap 95 % CI (``scipy.stats.bootstrap``, BCa, resampling rounds;
  seeded, so tables regenerate identically);
* the **Wilcoxon signed-rank** test (two-sided; rounds with a zero difference are dropped, the
  ``wilcox`` convention), which assumes no normality of the differences: :func:`signed_rank_p`.

Two choices in the test, both because the inputs are served *fractions* of small integers:

* **Ties are ties.** Differences are rounded to ``TIE_DECIMALS`` decimals before ranking: ``a/K -
  b/K`` for equal integer differences can differ in the last bit, and unrounded they would be
  ranked apart instead of sharing a mid-rank, which made the p-value depend on K (the same counts
  gave 0.675 as fractions and 0.960 as counts). The mean and the bootstrap CI use the differences
  as they are.
* **Exact where few rounds differ.** With up to ``EXACT_MAX`` non-zero differences the p-value is
  the exact one of the signed-rank statistic under random signs, conditional on the observed
  (mid-)ranks -- ties and dropped zeros included -- by dynamic programming over the doubled ranks.
  Beyond that, scipy's normal approximation (tie-corrected) is used. scipy's own default falls back
  to the normal approximation whenever a zero or a tie is present, and that is optimistic when
  only a few rounds differ (5 of 50 rounds one user apart: 0.025, exactly 0.0625).

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
#: differences are rounded to this many decimals before ranking (served fractions of K <= 10^4 users
#: differ by >= 1e-4, so no real difference is merged; last-bit noise is)
TIE_DECIMALS = 12
#: up to this many non-zero differences the signed-rank p-value is exact (the null distribution has
#: at most EXACT_MAX * (EXACT_MAX + 1) + 1 points: a few ms)
EXACT_MAX = 200


def signed_rank_p(d: np.ndarray) -> float:
    """Two-sided Wilcoxon signed-rank p-value of the paired differences ``d`` (zeros dropped; NaN if
    any is not finite; 1.0 if none is non-zero). See the module docstring for ties and exactness."""
    d = np.asarray(d, dtype=float)
    if not np.all(np.isfinite(d)):
        return float("nan")
    x = np.round(d, TIE_DECIMALS)
    x = x[x != 0]
    n = len(x)
    if n == 0:
        return 1.0
    if n > EXACT_MAX:
        return float(stats.wilcoxon(x, zero_method="wilcox", method="approx").pvalue)
    # doubled mid-ranks are integers: the statistic T+ (sum of the positive ones) has an integer support
    r2 = np.rint(2.0 * stats.rankdata(np.abs(x))).astype(np.int64)
    t_plus = int(r2[x > 0].sum())
    dist = np.zeros(int(r2.sum()) + 1)  # P(T+ = t) under independent fair signs, built one rank at a time
    dist[0] = 1.0
    top = 0
    for w in r2.tolist():
        shifted = dist[: top + 1].copy()
        dist[: top + 1] *= 0.5
        dist[w : w + top + 1] += 0.5 * shifted
        top += w
    p = 2.0 * min(dist[: t_plus + 1].sum(), dist[t_plus:].sum())
    return float(min(1.0, p))


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
    if not np.isfinite(mean):
        return PairedDifference(mean, np.nan, np.nan, np.nan, n)  # a NaN or an infinity: nothing to test
    p = signed_rank_p(d)
    if n < 2 or np.all(d == d[0]):
        # no spread: every resample has the same mean (BCa is undefined)
        return PairedDifference(mean, mean, mean, p, n)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # BCa's degenerate-data warning: handled by the fallback below
        res = stats.bootstrap((d,), np.mean, confidence_level=CONFIDENCE, n_resamples=RESAMPLES, method="BCa", rng=np.random.default_rng(seed))
        lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
        if not (np.isfinite(lo) and np.isfinite(hi)):
            res = stats.bootstrap((d,), np.mean, confidence_level=CONFIDENCE, n_resamples=RESAMPLES, method="percentile", rng=np.random.default_rng(seed))
            lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
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
