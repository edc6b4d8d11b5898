"""The exhaustive search over a round's assignments: depth-first branch and bound, exact.

:func:`exhaustive_search` goes depth-first over users (tightest first) with the exact incremental
check (``envs.PlanBuilder``), vectorised over chunks of partial plans. Pruning is exact: an
infeasible partial plan has no feasible extension (feasible sets are downward closed), and a
node is dropped when :func:`node_bound` -- the users that still fit it, and how many of them
the compute and KV memory left could take (lower bounds from ``agents.cost_envelope``) --
cannot beat the incumbent. With monotone costs it also breaks symmetry: a user may not be
rejected while a user dominating it (:mod:`agents.dominance`) is served in the matching mode --
some largest plan always obeys this -- which cut the proof times at K = 70 several-fold.

Separate from the schedulers built on it (:mod:`agents.optimal`: :class:`~agents.optimal.Exhaustive`
runs it to completion, :func:`~agents.optimal.certify` descends on its target): this module is the
search and its node bound only, with no incumbents, time budgets across stages or upper bounds of
other kinds.
"""

from __future__ import annotations

import time

import numpy as np

from agents.cost_envelope import CostEnvelope
from agents.dominance import dominance, forced
from envs.cost_model import CostModel
from envs.feasibility import EPS
from envs.plan import AD, SD
from envs.plan_builder import PlanBuilder
from envs.workload import Round


def _grown(env: CostEnvelope, cost: CostModel, builder: PlanBuilder, i: int, fit: np.ndarray, rem: dict, gamma: int, upto: int):
    """Lower bounds on mode ``i``'s share and KV bytes after adding ``a = 0..upto`` users.

    The ``a`` added users come from the remaining users that fit (``fit``, (N, R)), so the grown
    batch's longest input is at least the larger of today's and the ``a``-th smallest candidate
    input; likewise outputs and iterations; its tightest slack at most the ``a``-th largest
    candidate slack, its slowest uplink at least the ``a``-th smallest. Costs from the envelope.
    """
    mode = AD if i == 0 else SD
    big = np.iinfo(np.int64).max // 4

    def kth(values, descending=False):
        v = np.where(fit, -values if descending else values, big if values.dtype.kind == "i" else np.inf)
        srt = np.sort(v, axis=1)[:, :upto]
        if srt.shape[1] < upto:
            srt = np.pad(srt, ((0, 0), (0, upto - srt.shape[1])), constant_values=srt.dtype.type(big) if srt.dtype.kind == "i" else np.inf)
        return -srt if descending else srt

    b_now = builder.b[i][:, None]
    s_a = np.maximum(builder.s_max[i][:, None], kth(rem["input"]))
    n_a = np.maximum(builder.n_max[i][:, None], kth(rem["output"]))
    valid = (s_a < big) & (n_a < big)
    s_a, n_a = np.where(valid, s_a, env.levels["input"][-1]), np.where(valid, n_a, env.levels["output"][-1])
    slack = np.minimum(builder.slack_min[i][:, None], kth(rem["slack"], descending=True))
    up = np.maximum(builder.u_max[i][:, None], kth(rem["uplink"]))
    size = b_now + np.arange(1, upto + 1)[None, :]
    i_iter = None
    if mode == SD:
        j_a = np.maximum(builder.j_max[:, None], kth(rem["iterations"]))
        valid &= j_a < big
        i_iter = env.level_of("iterations", np.where(valid, j_a, env.levels["iterations"][-1]))
    c = env.cost_lb_arrays(mode, size, env.level_of("input", s_a), env.level_of("output", n_a), i_iter)
    beta = slack - up
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        share = np.where(valid & (beta > 0) & (size <= env.k), c / np.where(beta > 0, beta, 1.0), np.inf)
    out_sorted = kth(rem["output"]).astype(float)
    cum_out = np.cumsum(np.where(np.isfinite(out_sorted) & (out_sorted < big), out_sorted, 0.0), axis=1)
    extra = gamma if mode == SD else 0
    unit = cost.kv_l if mode == AD else cost.kv_sd
    if cost.kv_memory == "per_user":
        mem = (size * (s_a + extra) + builder.sum_out[i][:, None] + cum_out) * unit
    else:
        mem = size * (s_a + n_a + extra) * unit
    if mode == SD:
        mem = mem + size * cost.sd_user_bytes  # the per-SD-user workspace of the cost model
    share = np.concatenate([builder.share[i][:, None], share], axis=1)
    mem = np.concatenate([builder.mem[i][:, None], np.where(valid, mem, np.inf)], axis=1)
    return share, mem


def node_bound(builder: PlanBuilder, alive: np.ndarray, admitted: np.ndarray, ctx: tuple, level: int, batch: int = 50_000,
               must: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Refresh which remaining users still fit each partial plan, and bound its best completion.

    Valid because feasible sets are downward closed and costs are bounded below by
    ``agents.cost_envelope``: a user that does not fit a partial plan alone fits none of its
    extensions, so ``alive`` (inherited from the parent) only loses entries; and a completion
    adding ``a`` AD and ``s`` SD users (``a <= #fit AD``, ``s <= #fit SD``, ``a + s <= #alive``)
    needs the lower bounds of :func:`_grown` on both shares to sum to at most 1 and on both KV
    needs to fit the memory. The largest such ``a + s`` bounds every completion. ``must``
    ((N, K - level) bool, optional) marks remaining users the search has to serve
    (:mod:`agents.dominance`); a partial plan where one of them no longer fits gets bound -1.
    Returns ``(alive, bound)``.
    """
    env, rnd, order, gamma = ctx
    user_arrays = (rnd.input_tokens, rnd.output_tokens, rnd.alpha, rnd.uplink_s, rnd.slack_s)
    alive = alive.copy()
    n, k = alive.shape
    fit = np.zeros((2, n, k), dtype=bool)
    rows, cols = np.nonzero(alive[:, level:])
    cols = cols + level
    for lo in range(0, len(rows), batch):
        r, c = rows[lo : lo + batch], cols[lo : lo + batch]
        masks = builder.take(r).prepare(*(x[order[c]] for x in user_arrays))
        fit[0, r, c], fit[1, r, c] = masks[:, 1], masks[:, 1 + gamma]
        alive[r, c] = masks[:, 1] | masks[:, 1 + gamma]
    dead = np.zeros(n, dtype=bool) if must is None else (must & ~alive[:, level:]).any(axis=1)
    n_alive = alive[:, level:].sum(axis=1)
    upto = int(n_alive.max(initial=0))
    if upto == 0:
        return alive, np.where(dead, -1, admitted)
    cost = builder.cost
    users = order[level:]
    rem = {"input": rnd.input_tokens[users], "output": rnd.output_tokens[users], "iterations": env.user_values["iterations"][users], "slack": rnd.slack_s[users], "uplink": rnd.uplink_s[users]}
    share_a, mem_a = _grown(env, cost, builder, 0, fit[0][:, level:], rem, gamma, upto)
    share_s, mem_s = _grown(env, cost, builder, 1, fit[1][:, level:], rem, gamma, upto)
    fit_ad, fit_sd = fit[0].sum(axis=1), fit[1].sum(axis=1)
    budget_sd = float(cost.memory_budget(True)) * (1 + EPS)
    budget_ad = float(cost.memory_budget(False)) * (1 + EPS)
    best = np.zeros(n, dtype=np.int64)
    s_idx = np.arange(upto + 1)[None, :]
    sd_used = (builder.b[1][:, None] + s_idx) > 0
    for a in range(upto + 1):
        ok_a = a <= fit_ad
        if not ok_a.any():
            break
        fits = (share_s + share_a[:, a : a + 1] <= 1.0 + EPS) & (mem_s + mem_a[:, a : a + 1] <= np.where(sd_used, budget_sd, budget_ad))
        # the largest s that passes both necessary conditions (no monotonicity in s assumed)
        last = np.where(fits.any(axis=1), upto - np.argmax(fits[:, ::-1], axis=1), -1)
        s_max = np.minimum(np.minimum(last, fit_sd), n_alive - a)
        best = np.where(ok_a & (s_max >= 0), np.maximum(best, a + s_max), best)
    return alive, np.where(dead, -1, admitted + np.minimum(best, n_alive))


def exhaustive_search(cost: CostModel, rnd: Round, gamma: int, incumbent: int = 0, time_limit_s: float = float("inf"), chunk: int = 20_000,
                      envelope: CostEnvelope | None = None, symmetry: bool = True) -> tuple[np.ndarray | None, bool, int]:
    """Best plan with draft depth ``gamma`` serving more than ``incumbent`` users.

    Depth-first over users, breadth-first (vectorised) within chunks of at most ``chunk`` partial
    plans, so memory stays bounded and complete plans are reached early (a better incumbent
    prunes more). A node is pruned when the bound of :func:`node_bound` (users that still fit,
    and the compute left) cannot beat the incumbent. Returns ``(modes or None, complete,
    upper_bound)``: ``modes`` is None if no plan beats the incumbent; ``complete`` is False if
    the time limit stopped the search, in which case ``upper_bound`` is still valid (no
    unexplored node could exceed it: each keeps its parent's bound). With ``symmetry`` (and
    monotone costs) a user may not be rejected while a user dominating it is served in the matching
    mode (:mod:`agents.dominance`: some largest plan always obeys this), which spares whole
    subtrees; the plan returned is then one of the largest, not necessarily the first in order.
    """
    k = rnd.num_users
    if k == 0:  # no plan serves more than the incumbent (>= 0); the envelope needs a user
        return None, True, 0
    start = time.perf_counter()
    # tight users first: infeasible branches die early
    order = np.argsort(rnd.slack_s - rnd.uplink_s, kind="stable")
    sd_action = 1 + gamma
    user_arrays = (rnd.input_tokens, rnd.output_tokens, rnd.alpha, rnd.uplink_s, rnd.slack_s)
    ctx = (envelope or CostEnvelope(cost, rnd, gamma), rnd, order, gamma)
    dom = dominance(ctx[0], rnd, order) if symmetry else None
    use_dom = dom is not None and bool(dom[AD].any() or dom[SD].any())
    stack = [(0, PlanBuilder(cost, 1, gamma), np.zeros((1, 0), dtype=np.int8), np.zeros(1, dtype=np.int64), np.ones((1, k), dtype=bool), np.full(1, k))]
    best, best_modes = incumbent, None
    while stack:
        level, builder, paths, admitted, alive, ub = stack.pop()
        keep = ub > best
        if not keep.any():
            continue
        if time.perf_counter() - start > time_limit_s:
            pending = [int(u.max()) for *_, u in stack] + [int(ub[keep].max())]
            return best_modes, False, max(best, *pending)
        if level < k:
            rows = np.flatnonzero(keep)
            builder, paths, admitted = builder.take(rows), paths[rows], admitted[rows]
            must = forced(paths, dom, level) if use_dom else None
            alive, ub = node_bound(builder, alive[rows], admitted, ctx, level, must=must)
            keep = ub > best
            if not keep.any():
                continue
        if level == k:
            i = int(np.argmax(np.where(keep, admitted, -1)))
            best, best_modes = int(admitted[i]), np.zeros(k, dtype=np.int8)
            best_modes[order] = paths[i]
            continue
        rows = np.flatnonzero(keep)
        child_rows = np.repeat(rows, 3)
        actions = np.tile(np.array([0, 1, sd_action]), len(rows))  # reject pushed first = explored last
        b = builder.take(child_rows)
        user = order[level]
        masks = b.prepare(*(np.repeat(x[user : user + 1], len(child_rows)) for x in user_arrays))
        ok = masks[np.arange(len(child_rows)), actions]
        if use_dom:  # a user a served dominator forces in may not be rejected
            ok &= (actions != 0) | ~np.repeat(forced(paths[rows], dom, level)[:, 0], 3)
        b.apply(np.where(ok, actions, 0))
        sel = np.flatnonzero(ok)
        mode = np.where(actions == 0, 0, np.where(actions == 1, AD, SD)).astype(np.int8)
        new_paths = np.concatenate([paths[child_rows[sel]], mode[sel, None]], axis=1)
        new_admitted = admitted[child_rows][sel] + (mode[sel] != 0)
        new_alive = alive[child_rows[sel]]
        new_ub = ub[child_rows[sel]]
        new_builder = b.take(sel)
        # chunks ordered so that the most-admitted children are popped first
        by = np.argsort(new_admitted, kind="stable")
        for lo in range(0, len(by), chunk):
            idx = by[lo : lo + chunk]
            stack.append((level + 1, new_builder.take(idx), new_paths[idx], new_admitted[idx], new_alive[idx], new_ub[idx]))
    return best_modes, True, best
