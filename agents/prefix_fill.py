"""The longest fitting prefixes of many candidate batches at once: the re-packs' one pricing step.

Both post-step re-packs (``agents.plan_repair.improve``, one batch around the plan's own thresholds;
``agents.mixed_repack``, an AD and an SD batch from scratch) fill a batch with eligible users in one
fixed order, as many as fit. :func:`longest_prefixes` answers that for C candidate rows in a few
vectorised calls of the cost model, with the exact check's formulas (``tests/test_general.py`` holds
it to ``envs.feasibility.check_plans`` on every prefix).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from envs.cost_model import CostModel, sd_iterations
from envs.feasibility import EPS, share_needed
from envs.plan import AD, SD
from envs.workload import Round

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

#: how the re-packs rank candidates serving as many users: key = users - TIE_WEIGHT x fullness (the
#: larger of compute share and memory used, 0..1), so the emptier plan wins (0 = the first found)
TIE_WEIGHT = 0.5


def _leading_run(fits: np.ndarray) -> np.ndarray:
    """Per row of ``fits`` (C, M): how many leading columns are True."""
    return np.where(fits.all(axis=1), fits.shape[1], np.argmin(fits, axis=1))


def longest_prefixes(cost: CostModel, rnd: Round, order: np.ndarray, eligible: np.ndarray, mode: int, gamma: int, other: tuple, sd_used: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """Per candidate row of ``eligible`` (C, K) over the users in ``order``: how many of its eligible
    users (in that order) fit as one batch of ``mode`` beside a batch using ``other`` (share, bytes;
    scalars or one per row; ``sd_used`` likewise), and how full that plan is (the larger of compute
    share and memory used, 0..1).

    The batch aggregates of every prefix come from running sums / maxima; a prefix that fits stays
    fitting when shortened (downward closed), so each row's last fitting prefix is found in two
    passes over blocks of ~sqrt(K) columns: the cost model is priced at O(C sqrt K) points in two
    calls, not O(C K) (and not log2 K calls, whose per-call overhead dominates at these sizes).
    Where fitting is not downward closed (a measured profile whose pass time falls as the batch
    grows), the count is still that of a prefix that was priced and fits, just not always the longest."""
    # token counts as int32: exact, and half the memory traffic of the (C, K) running aggregates
    inp, out = (x[order].astype(np.int32) for x in (rnd.input_tokens, rnd.output_tokens))
    up, slack = rnd.uplink_s[order], rnd.slack_s[order]
    c, k = eligible.shape
    # the running aggregates in (K, C) layout: numpy accumulates along the first axis over contiguous
    # rows, many times faster than along the last axis of a (C, K) array
    el = np.ascontiguousarray(eligible.T)
    b = np.cumsum(el, axis=0, dtype=np.int32)
    s = np.maximum.accumulate(np.where(el, inp[:, None], 0), axis=0)
    n = np.maximum.accumulate(np.where(el, out[:, None], 0), axis=0)
    u = np.maximum.accumulate(np.where(el, up[:, None], 0.0), axis=0)
    sl = np.minimum.accumulate(np.where(el, slack[:, None], np.inf), axis=0)
    so = np.cumsum(np.where(el, out[:, None], 0), axis=0, dtype=np.int32)
    j = np.maximum.accumulate(np.where(el, sd_iterations(out, rnd.alpha[order], gamma)[:, None], 0), axis=0) if mode == SD else None
    budget = np.where(sd_used, cost.memory_budget1(True), cost.memory_budget1(False)) * (1 + EPS)
    other_share, other_mem = (np.broadcast_to(np.asarray(x, dtype=float), (c,)) for x in other)
    budget = np.broadcast_to(budget, (c,))
    rows = np.arange(c)[:, None]

    def fits_at(cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Whether the prefix up to column ``cols[r, m]`` of row ``r`` fits, and how full it is."""
        at = (np.clip(cols, 0, k - 1), rows)
        bb, ss, nn, oo = b[at], s[at], n[at], so[at]
        if mode == AD:
            t, mem = cost.ad_time(bb, ss, nn), cost.ad_memory(bb, ss, nn, oo)
        else:
            t, mem = cost.sd_time(bb, ss, nn, j[at], gamma), cost.sd_memory(bb, ss, nn, oo, gamma)
        with np.errstate(invalid="ignore"):
            share = share_needed(t, bb, u[at], sl[at]) + other_share[:, None]
            fits = (share <= 1 + EPS) & (mem + other_mem[:, None] <= budget[:, None])
        # fullness: a zero budget (the weights take all the memory) is full once anything is held, not 0/0
        held = mem + other_mem[:, None]
        full = np.divide(held, budget[:, None], out=np.where(held > 0, np.inf, 0.0), where=budget[:, None] > 0)
        return (fits | (bb == 0)) & (cols < k), np.maximum(share, full)

    # fitting is monotone along the columns (prefixes only grow): find each row's last fitting column
    # in two vectorised passes -- every block's last column, then the columns of the block after the
    # last fitting one (blocks of ~sqrt(K) columns: two calls of the cost model instead of log2(K))
    block = max(1, math.isqrt(k - 1) + 1)
    coarse = np.arange(block - 1, k + block - 1, block)[None, :]  # the last may lie past the end: never fits
    fits, used = fits_at(np.broadcast_to(coarse, (c, coarse.shape[1])))
    # counted as leading runs (up to the first column that does not fit), not as sums: equal when
    # fitting is downward closed, and otherwise (a measured profile whose pass time falls with the
    # batch) the prefix returned is still one that was priced and fits
    n_blocks = _leading_run(fits)  # blocks whose last column fits
    first = n_blocks * block  # first column not yet known to fit
    # at least one fine column (K = 1 has blocks of one: that column is the first known not to fit)
    fine = first[:, None] + np.arange(max(block - 1, 1))[None, :]
    fits2, used2 = fits_at(fine)
    n_fine = _leading_run(fits2)
    last = first - 1 + n_fine  # -1: not even the first column fits
    r = np.arange(c)
    used = np.where(n_fine > 0, used2[r, np.maximum(n_fine - 1, 0)], np.where(n_blocks > 0, used[r, np.maximum(n_blocks - 1, 0)], 0.0))
    return np.where(last >= 0, b[np.clip(last, 0, k - 1), r], 0), np.where(last >= 0, used, 0.0)
