"""Serve as many users as possible in ONE mode (AD or SD) with a given compute share and KV budget.

This is BALANCE's per-mode subproblem (balance.md §3.3), solved exactly. A batch's cost depends
only on its size ``b`` and its maxima, so the solver enumerates *thresholds* and, for each, takes
the cheapest eligible users in memory order:

* thresholds on the longest input ``S`` and (AD) the longest output ``N`` / (SD) the most
  iterations ``J`` and the longest output ``N``; for each ``(S, N)`` / ``(S, J)`` row the cost
  ``C(b, row)`` is tabulated for every ``b`` once per round;
* the tightest slack ``s`` is enumerated too, and the uplink threshold is then implied: for a
  target size ``b`` the best uplink limit is ``s - C(b, theta) / share`` (every user with a faster
  uplink is eligible);
* eligible users are taken in ascending order of their KV need (``O_k``), as many as fit; the
  largest feasible ``b`` is found by binary search (feasibility is monotone in ``b``).

Rows are visited best-bound first (branch and bound): a row's bound ignores the slack/uplink
coupling, and the search stops when no remaining bound beats the incumbent.

**SD's output threshold.** SD's cost depends on ``N`` through the context its iterations attend to,
so ``N`` is a third threshold. Tabulating every ``(S, J, N)`` would cost K^3 rows; instead an SD
row ``(S, J)`` is tabulated at a *lower bound* on the ``N`` of any batch whose maxima are exactly
``(S, J)``: it holds a user with ``J_k = J`` and one with ``I_k = S``, and ``b`` users, so ``N`` is at
least the larger of those users' smallest outputs and of the ``b``-th smallest eligible output.
That keeps every row bound valid; a row that survives pruning is then solved over each output
threshold ``n`` it holds (users with ``O_k <= n``, costed exactly at ``n``), again best bound first.
Why this is exact: an optimal batch ``X`` with maxima ``(S, J, N)`` lies inside row ``(S, J)``'s
sub-problem ``n = N``, whose cost is ``X``'s own, and the slack/uplink/memory-order search of one
threshold tuple finds a batch at least as large as any batch inside it. This relies on ``C``
rising with ``b``, ``S``, ``N`` and ``J`` (``tau`` non-decreasing in batch, tokens and context).

``optimistic=True`` instead costs SD iterations at the prompt length alone (context growth
ignored) -- a relaxation used for certified upper bounds; its rows need no output threshold.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from envs.cost_model import CostModel, sd_iterations
from envs.plan import AD
from envs.workload import Round

EPS = 1e-9


@dataclass
class ModeTable:
    """Per-round, per-mode data shared by every (share, memory, user subset) query.

    Users are held in KV order (``O`` ascending); ``perm`` re-orders them by slack minus uplink
    time, descending.
    """

    mode: int
    gamma: int
    order: np.ndarray  #: user indices sorted by KV need (O ascending)
    out_sorted: np.ndarray  #: O_k in that order
    slack_sorted: np.ndarray
    up_sorted: np.ndarray
    perm: np.ndarray  #: positions (in KV order) sorted by slack minus uplink, descending
    elig: np.ndarray  #: (T, K) bool: user (KV order) within row thresholds
    s_thr: np.ndarray  #: (T,) input threshold (tokens)
    t_thr: np.ndarray  #: (T,) AD: output threshold (tokens); SD: iteration threshold
    n_lo: np.ndarray  #: (T,) output (tokens) the row's memory is priced at: exact for AD, a lower bound for SD
    n_hi: np.ndarray  #: (T,) longest output among the row's users
    cost: np.ndarray  #: (T, K + 1) C(b, row) in seconds, b = 0..K (SD: a lower bound, see above)
    mem_base: np.ndarray  #: (T,) per-user fixed KV tokens (S [+ N if padded] [+ gamma + workspace for SD])
    mem_unit: float  #: bytes per KV token of this mode
    per_user_out: bool  #: whether memory adds each user's own O_k
    cost_model: CostModel | None = None  #: set when SD rows are solved per output threshold
    _cache: tuple | None = None  #: requirement matrices with every user available

    @property
    def num_tuples(self) -> int:
        return len(self.s_thr)

    def requirements(self, avail_sorted: np.ndarray, min_users: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per row and eligible rank: the compute share and KV tokens a batch of that size needs.

        ``share_req[t, r]`` is the share needed by the ``r+1`` eligible users with the largest
        slack minus uplink time (every member of a batch must have at least ``C / share`` of it), and
        ``mem_req[t, r]`` the KV tokens of the ``r+1`` users with the smallest outputs. Both rise
        with ``r``, so a size bound is a count of entries under a limit. Only rows with more
        than ``min_users`` eligible users are returned (the rest cannot beat an incumbent), as
        ``(rows, elig, n0, share_req, mem_req)``; the all-users answer is cached.
        """
        everyone = bool(avail_sorted.all())
        if everyone and self._cache is not None:
            rows, elig, n0, share_req, mem_req = self._cache
            keep = n0 > min_users
            return rows[keep], elig[keep], n0[keep], share_req[keep], mem_req[keep]
        elig = self.elig & avail_sorted[None, :]
        n0 = elig.sum(axis=1)
        rows = np.flatnonzero(n0 > (0 if everyone else min_users))
        elig, n0 = elig[rows], n0[rows]
        share_req, mem_req = _requirements(self, elig, self.cost[rows], self.mem_base[rows])
        if everyone:
            self._cache = (rows, elig, n0, share_req, mem_req)
            return self.requirements(avail_sorted, min_users)
        return rows, elig, n0, share_req, mem_req


def _requirements(tab: ModeTable, elig: np.ndarray, cost_rows: np.ndarray, base: np.ndarray):
    """``(share_req, mem_req)`` of :meth:`ModeTable.requirements` for given rows' users and costs."""
    el_s = elig[:, tab.perm]
    rank_s = np.cumsum(el_s, axis=1)
    c = np.take_along_axis(cost_rows, np.minimum(rank_s, cost_rows.shape[1] - 1), axis=1)
    # every member k of a feasible batch has slack_k - uplink_k >= C(b) / share
    budget = (tab.slack_sorted - tab.up_sorted)[tab.perm][None, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        share_req = np.where(el_s & (budget > 0), c / np.where(budget > 0, budget, 1.0), np.inf)
    # (only counts of entries under a limit are ever taken, so no sorting is needed)
    if tab.per_user_out:
        cnt = np.cumsum(elig, axis=1)
        need = cnt * base[:, None] + np.cumsum(np.where(elig, tab.out_sorted[None, :], 0), axis=1)
        mem_req = np.where(elig, need, np.inf)
    else:
        r = np.arange(1, elig.shape[1] + 1)[None, :]
        mem_req = np.where(r <= elig.sum(axis=1)[:, None], r * base[:, None], np.inf)
    return share_req, mem_req


def build_table(cost: CostModel, rnd: Round, mode: int, gamma: int, optimistic: bool = False) -> ModeTable:
    """Tabulate thresholds, eligibility and batch cost for one mode of one round."""
    k = rnd.num_users
    order = np.argsort(rnd.output_tokens, kind="stable")
    inp = rnd.input_tokens[order]
    out = rnd.output_tokens[order]
    second = out if mode == AD else sd_iterations(out, rnd.alpha[order], gamma)
    s_vals = np.unique(inp)
    t_vals = np.unique(second)
    s_thr = np.repeat(s_vals, len(t_vals))
    t_thr = np.tile(t_vals, len(s_vals))
    elig = (inp[None, :] <= s_thr[:, None]) & (second[None, :] <= t_thr[:, None])
    keep = elig.any(axis=1)
    elig = elig[keep]
    # rows with the same eligible set are dominated by the one at that set's own maxima
    # initial=0: the same maxima (every kept row has a member); a round with no users has no rows
    s_thr = np.where(elig, inp[None, :], 0).max(axis=1, initial=0)
    t_thr = np.where(elig, second[None, :], 0).max(axis=1, initial=0)
    _, first = np.unique(np.stack([s_thr, t_thr], axis=1), axis=0, return_index=True)
    first = np.sort(first)
    elig, s_thr, t_thr = elig[first], s_thr[first], t_thr[first]
    b = np.arange(k + 1)[None, :]
    n_hi = np.where(elig, out[None, :], 0).max(axis=1, initial=0)
    padded = cost.kv_memory == "padded"
    if mode == AD:
        n_lo = t_thr
        c = cost.ad_time(b, s_thr[:, None], t_thr[:, None])
        unit = cost.kv_l
        base = s_thr + (t_thr if padded else 0)
    elif optimistic:
        n_lo = np.zeros_like(n_hi)
        c = cost.sd_time(b, s_thr[:, None], 0, t_thr[:, None], gamma)
        unit = cost.kv_sd
        base = s_thr + gamma + cost.sd_user_extra_tokens
    else:
        big = np.iinfo(np.int64).max
        # a batch with these maxima holds a user at J and one at S: N is at least their outputs
        at_j = np.where(elig & (second[None, :] == t_thr[:, None]), out[None, :], big).min(axis=1, initial=big)
        at_s = np.where(elig & (inp[None, :] == s_thr[:, None]), out[None, :], big).min(axis=1, initial=big)
        n_lo = np.maximum(at_j, at_s)
        # ... and b users, so N is at least the b-th smallest eligible output (KV order is O order)
        ranked = np.sort(np.where(elig, out[None, :], big), axis=1)
        nth = np.concatenate([np.zeros((len(n_lo), 1), dtype=np.int64), ranked], axis=1)
        n_rank = np.minimum(np.maximum(nth, n_lo[:, None]), n_hi[:, None])  # b > |row| is never asked
        c = cost.sd_time(b, s_thr[:, None], n_rank, t_thr[:, None], gamma)
        unit = cost.kv_sd
        # per-SD-user workspace (envs.model_choices; 0 by default) priced as KV tokens of this mode
        base = s_thr + gamma + cost.sd_user_extra_tokens + (n_lo if padded else 0)
    slack = rnd.slack_s[order]
    return ModeTable(
        mode=mode,
        gamma=gamma,
        order=order,
        out_sorted=out,
        slack_sorted=slack,
        up_sorted=rnd.uplink_s[order],
        perm=np.argsort(-(slack - rnd.uplink_s[order]), kind="stable"),
        elig=elig,
        s_thr=s_thr,
        t_thr=t_thr,
        n_lo=n_lo,
        n_hi=n_hi,
        cost=np.asarray(c, dtype=float),
        mem_base=base.astype(float),
        mem_unit=float(unit),
        per_user_out=not padded,
        cost_model=cost if (mode != AD and not optimistic) else None,
    )


def _size_bound(tab: ModeTable, n0: np.ndarray, share_req: np.ndarray, mem_req: np.ndarray, share: float, mem: float) -> np.ndarray:
    """Per row: at most its user count, the ranks whose share fits and the ranks whose KV fits."""
    b_time = (share_req <= share * (1 + EPS)).sum(axis=1)
    b_mem = (mem_req <= mem / tab.mem_unit * (1 + EPS)).sum(axis=1)
    return np.minimum(np.minimum(n0, b_time), b_mem)


def _bounds(tab: ModeTable, avail: np.ndarray, share: float, mem: float, at_least: int = 0):
    """Upper bounds on the batch size of the rows that could beat ``at_least``: (rows, ub, elig)."""
    rows, elig, n0, share_req, mem_req = tab.requirements(avail, at_least)
    return rows, _size_bound(tab, n0, share_req, mem_req, share, mem), elig


def _best_for_tuple(tab: ModeTable, cost_row: np.ndarray, base: float, elig_row: np.ndarray, share: float, mem: float, lo: int, hi: int):
    """Largest b in [lo, hi] achievable with batch cost ``cost_row[b]`` (exact for the users in
    ``elig_row``) and ``base`` fixed KV tokens per user, with its chosen users; or (0, None)."""
    users = np.flatnonzero(elig_row)
    slack = tab.slack_sorted[users]
    up = tab.up_sorted[users]
    out = tab.out_sorted[users]
    slack_desc = np.sort(slack)[::-1]
    s_cands = slack_desc  # every eligible user's slack is a candidate threshold (ties are harmless)
    mem_tokens = mem / tab.mem_unit * (1 + EPS)
    up_min = float(up.min())

    def feasible(b: int):
        if b > len(users):
            return None
        # the uplink a threshold leaves, with the exact check's tolerance: envs.feasibility accepts
        # C / (s - u) <= share * (1 + EPS), i.e. u <= s - C / (share * (1 + EPS)) -- relative to the
        # batch time, not to the uplink (a tolerance relative to the uplink refused users the
        # check accepts when the uplink is short beside the batch time)
        u_lim = s_cands - cost_row[b] / (share * (1 + EPS))
        # only thresholds that leave b users with enough slack and some uplink budget can work
        ok_rows = (u_lim >= up_min) & (s_cands <= slack_desc[b - 1])
        if not ok_rows.any():
            return None
        sc, ul = s_cands[ok_rows], u_lim[ok_rows]
        el = (slack[None, :] >= sc[:, None]) & (up[None, :] <= ul[:, None])
        cnt = np.cumsum(el, axis=1)
        enough = cnt[:, -1] >= b
        if not enough.any():
            return None
        if tab.per_user_out:
            pos = np.argmax(cnt >= b, axis=1)
            cum_out = np.cumsum(np.where(el, out[None, :], 0), axis=1)
            need = b * base + cum_out[np.arange(len(sc)), pos]
        else:
            need = np.full(len(sc), b * base)
        good = enough & (need <= mem_tokens)
        if not good.any():
            return None
        row = int(np.argmax(good))
        chosen = np.flatnonzero(el[row])[:b]
        return users[chosen]

    best = feasible(lo)
    if best is None:
        return 0, None
    best_b = lo
    lo += 1
    while lo <= hi:
        mid = (lo + hi) // 2
        got = feasible(mid)
        if got is None:
            hi = mid - 1
        else:
            best_b, best, lo = mid, got, mid + 1
    return best_b, best


def _best_for_row(tab: ModeTable, t: int, elig_row: np.ndarray, share: float, mem: float, lo: int, hi: int):
    """:func:`_best_for_tuple` for row ``t``; an SD row priced at a lower bound is solved exactly
    over each output threshold ``n`` it holds (see the module docstring)."""
    if tab.cost_model is None or tab.n_lo[t] >= tab.n_hi[t]:
        return _best_for_tuple(tab, tab.cost[t], float(tab.mem_base[t]), elig_row, share, mem, lo, hi)
    out = tab.out_sorted
    cands = np.unique(out[elig_row & (out >= tab.n_lo[t])])[::-1]  # most users first
    sub_elig = elig_row[None, :] & (out[None, :] <= cands[:, None])
    b = np.arange(tab.cost.shape[1])[None, :]
    costs = np.asarray(tab.cost_model.sd_time(b, tab.s_thr[t], cands[:, None], tab.t_thr[t], tab.gamma), dtype=float)
    base = tab.s_thr[t] + tab.gamma + tab.cost_model.sd_user_extra_tokens + (0 if tab.per_user_out else cands)
    base = np.broadcast_to(np.asarray(base, dtype=float), cands.shape)
    ub = _count_bounds(tab, sub_elig, costs, base, share, mem)
    best_b, best = lo - 1, None
    for j in np.argsort(-ub, kind="stable"):
        if ub[j] <= best_b or best_b >= hi:
            break
        got_b, got = _best_for_tuple(tab, costs[j], float(base[j]), sub_elig[j], share, mem, best_b + 1, min(int(ub[j]), hi))
        if got_b > best_b:
            best_b, best = got_b, got
    return (best_b, best) if best is not None else (0, None)


def _count_bounds(tab: ModeTable, elig: np.ndarray, cost_rows: np.ndarray, base: np.ndarray, share: float, mem: float) -> np.ndarray:
    """Upper bounds on the batch size of given rows (their users, costs and per-user KV base)."""
    share_req, mem_req = _requirements(tab, elig, cost_rows, base)
    return _size_bound(tab, elig.sum(axis=1), share_req, mem_req, share, mem)


def _may_fit(tab: ModeTable, rows: np.ndarray, elig: np.ndarray, share: float, mem: float, b: int) -> np.ndarray:
    """A necessary condition, for many tuples at once, for ``b`` users to fit both time and memory.

    In any feasible set of ``b`` users every user k has ``t_u,k + C(b) / share <= s <= sigma_k``
    (``s`` the set's tightest slack), so its users all come from the eligible users with
    ``sigma_k - t_u,k >= C(b) / share``, and the ``b`` smallest outputs among those must fit the
    memory. Pruning on this spares most of the exact per-tuple checks that would fail.
    """
    need_s = tab.cost[rows, min(b, tab.cost.shape[1] - 1)] / share
    # looser than the exact check's C / (s - u) <= share * (1 + EPS) by ~EPS: a necessary condition
    # must never be the stricter one, and (1 - EPS) sat within rounding of the check's 1 / (1 + EPS)
    # (a user exactly at the check's tolerance was refused; tests/test_build_table_mutants.py)
    e = elig & ((tab.slack_sorted - tab.up_sorted)[None, :] >= need_s[:, None] * (1 - 2 * EPS))
    cnt = np.cumsum(e, axis=1)
    enough = cnt[:, -1] >= b
    mem_tokens = mem / tab.mem_unit * (1 + EPS)
    if tab.per_user_out:
        pos = np.argmax(cnt >= b, axis=1)
        need = b * tab.mem_base[rows] + np.cumsum(np.where(e, tab.out_sorted[None, :], 0), axis=1)[np.arange(len(rows)), pos]
    else:
        need = b * tab.mem_base[rows]
    return enough & (need <= mem_tokens)


def solve_mode(tab: ModeTable, avail: np.ndarray, share: float, mem: float, at_least: int = 0) -> np.ndarray:
    """Largest set of users (original indices) servable in this mode with ``share`` and ``mem``.

    ``avail`` (bool, original user order) marks users not taken elsewhere. Only sets larger than
    ``at_least`` are searched for; if none exists the empty set is returned.
    """
    if share <= 0 or mem <= 0:
        return np.zeros(0, dtype=np.int64)
    avail_sorted = np.asarray(avail, dtype=bool)[tab.order]
    if not avail_sorted.any():
        return np.zeros(0, dtype=np.int64)
    rows, ub, elig = _bounds(tab, avail_sorted, share, mem, at_least)
    best_b, best_set = at_least, None
    order = np.argsort(-ub, kind="stable")
    filtered_for = -1
    while True:
        order = order[ub[order] > best_b]
        if len(order) > 1 and filtered_for != best_b:
            # re-prune whenever the incumbent grows: the necessary check tightens with b
            order = order[_may_fit(tab, rows[order], elig[order], share, mem, best_b + 1)]
            filtered_for = best_b
        if len(order) == 0:
            break
        i, order = order[0], order[1:]
        b, chosen = _best_for_row(tab, int(rows[i]), elig[i], share, mem, best_b + 1, int(ub[i]))
        if b > best_b:
            best_b, best_set = b, chosen
    if best_set is None:
        return np.zeros(0, dtype=np.int64)
    return tab.order[best_set]


def upper_bound_grid(tab: ModeTable, shares: ArrayLike, mems: ArrayLike) -> np.ndarray:
    """Upper bounds on the single-mode optimum with every user available, for all ``shares`` x ``mems``."""
    shares = np.asarray(shares, dtype=float)
    mems = np.asarray(mems, dtype=float)
    everyone = np.ones(tab.elig.shape[1], dtype=bool)
    _, _, n0, share_req, mem_req = tab.requirements(everyone)
    # one share (memory) value at a time keeps memory at O(T K) for large rounds
    b_time = np.stack([(share_req <= s * (1 + EPS)).sum(axis=1) for s in shares])  # (S, T)
    b_mem = np.stack([(mem_req <= m / tab.mem_unit * (1 + EPS)).sum(axis=1) for m in mems])  # (M, T)
    ub = np.minimum(np.minimum(b_time[:, None, :], b_mem[None, :, :]), n0[None, None, :]).max(axis=2, initial=0)
    ub[shares <= 0, :] = 0
    ub[:, mems <= 0] = 0
    return ub
