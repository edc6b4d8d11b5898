"""The best AD-only re-pack over *every* (input cap, slack floor) pair, without pricing every pair.

The post-step's AD-only re-pack (``agents.plan_repair.improve``) fills one AD batch, in ascending
predicted output (ties: input), with the users under an input cap and above a slack floor, as many
as fit; it searches the caps and floors on a grid and around the best point. At K = 200 the rounds it
leaves short of BALANCE's all-AD plans are ones where the best pair lies off that search
(``results/improve_tuning.md``, row ``every_pair_ad``). Pricing all ~K^2 pairs costs ~0.3 s a round;
:func:`best_ad_prefix` finds the same best count in a few milliseconds by pruning with bounds that
hold for every pair, then pricing only the pairs that pass.

**Why the bounds are exact.** Let ``P`` be a fitting prefix of ``m`` users at some pair, ``c*`` its
largest input and ``f*`` its least slack. Then ``P`` is also the first ``m`` eligible users at the
pair ``(c*, f*)`` (that pair's eligible users are a subset of the first pair's, in the same order,
and contain ``P``). At ``(c*, f*)``: (i) at least ``m`` users are eligible; (ii) ``P``'s largest output
is at least ``n_m``, the larger of the ``m``-th smallest outputs among *all* users with input ``<= c*``
and among all with slack ``>= f*``, and its output sum at least ``so_m``, the larger of the two sums
of the ``m`` smallest; so, as the AD time grows with the output length and the KV with both (true of
every shipped profile: pass times are positive, fitted coefficients and engine terms non-negative),
``ad_time(m, c*, n_m) / f* <= 1 + EPS`` (an uplink only shrinks the budget, and a float division only
grows as its divisor shrinks) and ``ad_memory(m, c*, n_m, so_m) <= budget``. A pair failing any of
the three holds no fitting ``m``-prefix *as its own extremes*, and some pair that passes holds every
fitting ``m``-prefix. The first ``m`` eligible users of each pair that passes are then priced with
the exact check's formulas at their own values (largest input and output, output sum, slowest uplink,
least slack; ``envs.feasibility.share_needed``) -- so a plan returned always passes the exact check.

**Which m.** The count is searched by doubling from ``more_than + 1`` until a size fails, then by
bisection. That finds the largest fitting ``m`` when fitting is downward closed -- if some pair's
``m``-prefix fits, some pair's ``(m - 1)``-prefix does -- as with the analytic profiles; then the
result equals :func:`experiments.improve_tuning.every_pair_ad`'s (held to it and to a brute force
over every pair and prefix in ``tests/test_ad_prefix_search.py``). A measured profile whose pass time
falls as the batch grows can break that: the plan returned still fits, but a larger one may exist.

**Cost.** O(K^2) for the bounds and O(K) per pair that passes them, per size tried. With ``more_than``
near the answer (the post-step's case) that is 2-3 ms a validation round at K = 200; far from it, or
with uplinks that bind (the bounds ignore them), many pairs pass and it grows towards O(K^3) -- an
adversarial K = 300 round (uplinks near the slack, an incumbent 20 users short) took 0.9 s in review.

This is the best of a family, not the AD optimum: a prefix never skips a short-output user to drop a
slow uplink (BALANCE's per-mode solver, ``agents.mode_solver``, is exact, and out of the post-step's
time budget: building its table alone takes longer).
"""

from __future__ import annotations

import numpy as np

from envs.cost_model import CostModel
from envs.feasibility import EPS, share_needed
from envs.plan import AD
from envs.workload import Round


def best_ad_prefix(cost: CostModel, rnd: Round, more_than: int) -> np.ndarray | None:
    """An AD-only plan (modes (K,) int8 in {0, AD}) serving more than ``more_than`` users: the first
    ``m`` eligible users (ascending predicted output, ties: input) of some (input cap, slack floor)
    pair, for the largest ``m`` found (see the module docstring); ``None`` when no pair serves more.

    The SLM is not loaded (AD only), so the KV budget is ``cost.memory_budget1(False)``. Among the
    pairs whose ``m``-prefix fits, the emptiest (the larger of compute share and memory used) wins."""
    k = rnd.num_users
    lo = max(int(more_than), 0)  # the largest size known to fit (or the size to beat)
    if lo >= k:
        return None
    order = np.lexsort((rnd.input_tokens, rnd.output_tokens))
    inp, out = rnd.input_tokens[order].astype(np.int64), rnd.output_tokens[order].astype(np.int64)
    up, slack = rnd.uplink_s[order], rnd.slack_s[order]
    caps, floors = np.unique(inp), np.unique(slack)  # (C,), (F,): every distinct input and slack
    budget = cost.memory_budget1(False) * (1 + EPS)
    safe_floors = np.where(floors > 0, floors, np.nan)  # a floor <= 0 leaves no time: NaN fails every bound

    # (K, C) and (K, F) layouts: numpy accumulates along the first axis many times faster than the last
    under = inp[:, None] <= caps[None, :]  # (K, C) users under each cap, in ascending output
    n_under = np.cumsum(under, axis=0, dtype=np.int32)
    out_under = np.cumsum(np.where(under, out[:, None], 0), axis=0)
    over = slack[:, None] >= floors[None, :]  # (K, F) users above each floor
    n_over = np.cumsum(over, axis=0, dtype=np.int32)
    out_over = np.cumsum(np.where(over, out[:, None], 0), axis=0)
    # eligible counts at every pair: users with input <= cap and slack >= floor (a 2-D tail count)
    per_cell = np.zeros((len(caps), len(floors)), dtype=np.int32)
    np.add.at(per_cell, (np.searchsorted(caps, inp), np.searchsorted(floors, slack)), 1)
    n_eligible = np.cumsum(np.cumsum(per_cell, axis=0)[:, ::-1], axis=1)[:, ::-1]  # (C, F)
    # only pairs that are some prefix's own extremes: a user with input == cap and slack >= floor, and
    # one with slack == floor and input <= cap (any other pair's eligible set is a smaller pair's)
    extremes = (np.cumsum(per_cell[:, ::-1], axis=1)[:, ::-1] > 0) & (np.cumsum(per_cell, axis=0) > 0)  # (C, F)
    users = np.arange(k)[:, None]
    cap_ids, floor_ids = np.arange(len(caps)), np.arange(len(floors))

    def fitting_prefix(m: int) -> np.ndarray | None:
        """Users (round indices) of the emptiest fitting m-prefix over every pair, or None."""
        # bounds (i)-(iii) at size m: per cap, then per pair with the floor's side too
        pos = np.argmax(n_under >= m, axis=0)  # (C,) the m-th user under each cap
        n_m, so_m = out[pos], out_under[pos, cap_ids]
        t_m = np.where(n_under[-1] >= m, cost.ad_time(np.full(len(caps), m), caps, n_m), np.inf)
        mem_ok = (n_under[-1] >= m) & (cost.ad_memory(np.full(len(caps), m), caps, n_m, so_m) <= budget)
        with np.errstate(invalid="ignore"):
            ci, fi = np.nonzero(extremes & (n_eligible >= m) & mem_ok[:, None] & (t_m[:, None] / safe_floors[None, :] <= 1 + EPS))
            pos_f = np.argmax(n_over >= m, axis=0)  # (F,) the m-th user above each floor
            n_p = np.maximum(n_m[ci], out[pos_f][fi])
            so_p = np.maximum(so_m[ci], out_over[pos_f, floor_ids][fi])
            b = np.full(len(ci), m)
            tight = (cost.ad_time(b, caps[ci], n_p) / safe_floors[fi] <= 1 + EPS) & (cost.ad_memory(b, caps[ci], n_p, so_p) <= budget)
        ci, fi = ci[tight], fi[tight]
        if len(ci) == 0:
            return None
        # the first m eligible users of each pair left, priced at their own values as the exact check does
        eligible = (inp[:, None] <= caps[None, ci]) & (slack[:, None] >= floors[None, fi])  # (K, P)
        last = np.argmax(np.cumsum(eligible, axis=0, dtype=np.int32) >= m, axis=0)  # (P,) the m-th eligible user
        first_m = eligible & (users <= last[None, :])  # (K, P)
        s, n = np.where(first_m, inp[:, None], 0).max(axis=0), out[last]
        sl = np.where(first_m, slack[:, None], np.inf).min(axis=0)
        so = np.where(first_m, out[:, None], 0).sum(axis=0)  # not a matmul: BLAS would take every core
        u = np.where(first_m, up[:, None], 0.0).max(axis=0)
        b = np.full(len(ci), m)
        mem = cost.ad_memory(b, s, n, so)
        with np.errstate(invalid="ignore", divide="ignore"):
            share = share_needed(cost.ad_time(b, s, n), b, u, sl)
            fits = (share <= 1 + EPS) & (mem <= budget)
            fullness = np.where(fits, np.maximum(share, mem / budget), np.inf)
        return order[first_m[:, int(np.argmin(fullness))]] if fits.any() else None

    # doubling from lo + 1 until a size fails, then bisection between the last fit and the first failure
    best, hi, step = None, k + 1, 1  # hi: the least size known not to fit
    while lo + 1 < hi:
        m = min(lo + step, hi - 1) if step else (lo + hi) // 2
        chosen = fitting_prefix(m)
        if chosen is None:
            hi, step = m, 0
        else:
            best, lo = chosen, m
            step = 2 * step if step else 0
    if best is None:
        return None
    modes = np.zeros(k, dtype=np.int8)
    modes[best] = AD
    return modes
