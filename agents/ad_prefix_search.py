"""The best AD-only re-pack over *every* (input cap, slack floor) pair, without pricing every pair.

The post-step's AD-only re-pack (``agents.plan_repair.improve``) fills one AD batch, in ascending
predicted output (ties: input), with the users under an input cap and above a slack floor, as many
as fit; it searches the caps and floors on a grid and around the best point. At K = 200 the rounds it
leaves short of BALANCE's all-AD plans are ones where the best pair lies off that search
(``results/improve_tuning.md``, row ``every_pair_ad``). Pricing all ~K^2 pairs costs ~0.3 s a round;
:func:`best_ad_prefix` finds the same best count in a few milliseconds by pruning with bounds that
hold for every pair, then checking only the pairs that pass.

**Why the bounds are exact.** Let ``P`` be a fitting prefix of ``m`` users at some pair, ``c*`` its
largest input and ``f*`` its least slack. Then ``P`` is also the first ``m`` eligible users at the
pair ``(c*, f*)`` (that pair's eligible users are a subset of the first pair's, in the same order,
and contain ``P``). At ``(c*, f*)``: (i) at least ``m`` users are eligible; (ii) ``P``'s largest output
is at least ``n_m``, the larger of the ``m``-th smallest outputs among *all* users with input ``<= c*``
and among all with slack ``>= f*``, and its output sum at least ``so_m``, the larger of the two sums
of the ``m`` smallest; so, as the AD time grows with the output length and the KV with both,
``ad_time(m, c*, n_m) <= (1 + EPS) f*`` (an uplink only shrinks the budget) and
``ad_memory(m, c*, n_m, so_m) <= budget``. A pair failing any of the
three holds no fitting ``m``-prefix *as its own extremes*, and some pair that passes holds every
fitting ``m``-prefix. The pairs that pass are then checked exactly: their first ``m`` eligible users,
priced with the exact check's formulas (their own largest input and output, output sum, slowest
uplink and least slack, ``envs.feasibility.share_needed``).

Result: the largest ``m`` for which some pair's ``m``-prefix fits -- over every pair, the same count as
:func:`experiments.improve_tuning.every_pair_ad` (which takes each pair's longest fitting prefix; the
two agree wherever fitting is downward closed, as in the analytic cost model; held to it in
``tests/test_ad_prefix_search.py``). This is the best of a family, not the AD optimum: a prefix never
skips a short-output user to drop a slow uplink (BALANCE's per-mode solver, ``agents.mode_solver``,
is exact, and out of the post-step's time budget: building its table alone takes longer).
"""

from __future__ import annotations

import numpy as np

from envs.cost_model import CostModel
from envs.feasibility import EPS, share_needed
from envs.plan import AD
from envs.workload import Round


def best_ad_prefix(cost: CostModel, rnd: Round, at_least: int) -> np.ndarray | None:
    """An AD-only plan (modes (K,) int8 in {0, AD}) serving more than ``at_least`` users: the first
    ``m`` eligible users (ascending predicted output) of some (input cap, slack floor) pair, for the
    largest ``m`` any pair allows; ``None`` when no pair serves more than ``at_least``.

    The SLM is not loaded (AD only), so the KV budget is ``cost.memory_budget1(False)``. Among the
    pairs whose ``m``-prefix fits, the emptiest (the larger of compute share and memory used) wins."""
    k = rnd.num_users
    m = max(int(at_least), 0) + 1
    if m > k:
        return None
    order = np.lexsort((rnd.input_tokens, rnd.output_tokens))
    inp, out = rnd.input_tokens[order].astype(np.int64), rnd.output_tokens[order].astype(np.int64)
    up, slack = rnd.uplink_s[order], rnd.slack_s[order]
    caps, floors = np.unique(inp), np.unique(slack)  # (C,), (F,): every distinct input and slack
    budget = cost.memory_budget1(False) * (1 + EPS)

    # per cap: users with input <= cap, in ascending output -- their running count and output sum
    # (K, C) layout throughout: numpy accumulates along the first axis many times faster than the last
    under = inp[:, None] <= caps[None, :]  # (K, C)
    n_under = np.cumsum(under, axis=0, dtype=np.int32)  # (K, C)
    out_under = np.cumsum(np.where(under, out[:, None], 0), axis=0)  # (K, C)
    # per floor: the same for users with slack >= floor (the pair's m-th output is at least both)
    over = slack[:, None] >= floors[None, :]  # (K, F)
    n_over = np.cumsum(over, axis=0, dtype=np.int32)  # (K, F)
    out_over = np.cumsum(np.where(over, out[:, None], 0), axis=0)  # (K, F)
    # eligible counts at every pair: users with input <= cap and slack >= floor (a 2-D tail count)
    per_cell = np.zeros((len(caps), len(floors)), dtype=np.int32)
    np.add.at(per_cell, (np.searchsorted(caps, inp), np.searchsorted(floors, slack)), 1)
    n_eligible = np.cumsum(np.cumsum(per_cell, axis=0)[:, ::-1], axis=1)[:, ::-1]  # (C, F)
    # only pairs that are some prefix's own extremes: a user with input == cap and slack >= floor, and
    # one with slack == floor and input <= cap (any other pair's eligible set is a smaller pair's)
    extremes = (np.cumsum(per_cell[:, ::-1], axis=1)[:, ::-1] > 0) & (np.cumsum(per_cell, axis=0) > 0)  # (C, F)
    users = np.arange(k)[:, None]
    best: tuple[int, np.ndarray] | None = None
    while m <= k:
        # bounds (i)-(iii) at size m, per cap then per pair
        enough = n_under[-1] >= m  # (C,)
        pos = np.argmax(n_under >= m, axis=0)  # (C,) the m-th user under each cap
        n_m, so_m = out[pos], out_under[pos, np.arange(len(caps))]
        t_m = np.where(enough, cost.ad_time(np.full(len(caps), m), caps, n_m), np.inf)
        mem_ok = enough & (cost.ad_memory(np.full(len(caps), m), caps, n_m, so_m) <= budget)
        ci, fi = np.nonzero(extremes & (n_eligible >= m) & mem_ok[:, None] & (t_m[:, None] <= (1 + EPS) * floors[None, :]))
        # the same bounds per surviving pair with the larger of its cap's and its floor's m-th output and sum
        pos_f = np.argmax(n_over >= m, axis=0)  # (F,) the m-th user above each floor (enough of them: n_eligible >= m)
        n_p = np.maximum(n_m[ci], out[pos_f][fi])
        so_p = np.maximum(so_m[ci], out_over[pos_f, np.arange(len(floors))][fi])
        b = np.full(len(ci), m)
        tight = (cost.ad_time(b, caps[ci], n_p) <= (1 + EPS) * floors[fi]) & (cost.ad_memory(b, caps[ci], n_p, so_p) <= budget)
        ci, fi = ci[tight], fi[tight]
        if len(ci) == 0:
            break
        # exact check of each surviving pair's first m eligible users, priced at the pair's own cap and
        # floor: a fitting prefix whose extremes these are is priced exactly, and every fitting prefix
        # is some surviving pair's (above); elsewhere the price is on the safe side
        eligible = (inp[:, None] <= caps[None, ci]) & (slack[:, None] >= floors[None, fi])  # (K, P)
        last = np.argmax(np.cumsum(eligible, axis=0, dtype=np.int32) >= m, axis=0)  # (P,) the m-th eligible user
        first_m = eligible & (users <= last[None, :])  # (K, P)
        s, sl, n = caps[ci], floors[fi], out[last]
        so = np.where(first_m, out[:, None], 0).sum(axis=0)  # (P,) not a matmul: BLAS would take every core
        u = np.where(first_m, up[:, None], 0.0).max(axis=0)
        b = np.full(len(ci), m)
        mem = cost.ad_memory(b, s, n, so)
        with np.errstate(invalid="ignore", divide="ignore"):
            share = share_needed(cost.ad_time(b, s, n), b, u, sl)
            fits = (share <= 1 + EPS) & (mem <= budget)
            fullness = np.where(fits, np.maximum(share, mem / budget), np.inf)
        if not fits.any():
            break
        best = (m, order[first_m[:, int(np.argmin(fullness))]])
        m += 1
    if best is None:
        return None
    modes = np.zeros(k, dtype=np.int8)
    modes[best[1]] = AD
    return modes
