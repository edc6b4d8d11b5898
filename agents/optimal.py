"""The exact optimum of a round, and proven upper bounds where it is out of reach.

* :func:`exhaustive_search`: depth-first over users (tightest first) with the exact incremental
  check (``envs.PlanBuilder``), vectorised over chunks of partial plans. Pruning is exact: an
  infeasible partial plan has no feasible extension (feasible sets are downward closed), and a
  node is dropped when :func:`_node_bound` -- the users that still fit it, and how many of them
  the compute and KV memory left could take (lower bounds from ``agents.cost_envelope``) --
  cannot beat the incumbent. With monotone costs it also breaks symmetry: a user may not be
  rejected while a user dominating it (:mod:`agents.dominance`) is served in the matching mode --
  some largest plan always obeys this -- which cut the proof times at K = 70 several-fold.
* :class:`Exhaustive` (K <= 16): that search, run to completion.
* :class:`Optimal` (any K): anytime certification (:func:`certify`) -- BALANCE and given plans as
  incumbents, the split bound, the joint bound (:mod:`agents.joint_bound`), a descent on the target with the exhaustive search (each complete
  search that finds no plan serving ``T`` users proves ``OPT <= T - 1``), and optionally the MILP
  relaxation of ``agents.round_milp``. Returns the optimum (``gap = 0``) or the best plan found
  with a proven upper bound, and the trace of both over time.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from agents.balance import grid, split_search
from agents.cost_envelope import CostEnvelope
from agents.dominance import dominance, forced
from agents.joint_bound import joint_upper_bound
from agents.local_search import improve
from agents.mode_solver import build_table, solve_mode, upper_bound_grid
from agents.plan_repair import repair
from agents.round_milp import RoundMILP
from agents.scheduler import Scheduler
from envs.cost_model import CostModel
from envs.feasibility import EPS, check_plans
from envs.plan import AD, DEFAULT_DRAFT_DEPTH, SD, Plan
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


def _node_bound(builder: PlanBuilder, alive: np.ndarray, admitted: np.ndarray, ctx: tuple, level: int, batch: int = 50_000, must: np.ndarray | None = None):
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


def exhaustive_search(cost: CostModel, rnd: Round, gamma: int, incumbent: int = 0, time_limit_s: float = float("inf"), chunk: int = 20_000, envelope: CostEnvelope | None = None, symmetry: bool = True):
    """Best plan with draft depth ``gamma`` serving more than ``incumbent`` users.

    Depth-first over users, breadth-first (vectorised) within chunks of at most ``chunk`` partial
    plans, so memory stays bounded and complete plans are reached early (a better incumbent
    prunes more). A node is pruned when the bound of :func:`_node_bound` (users that still fit,
    and the compute left) cannot beat the incumbent. Returns ``(modes or None, complete,
    upper_bound)``: ``modes`` is None if no plan beats the incumbent; ``complete`` is False if
    the time limit stopped the search, in which case ``upper_bound`` is still valid (no
    unexplored node could exceed it: each keeps its parent's bound). With ``symmetry`` (and
    monotone costs) a user may not be rejected while a user dominating it is served in the matching
    mode (:mod:`agents.dominance`: some largest plan always obeys this), which spares whole
    subtrees; the plan returned is then one of the largest, not necessarily the first in order.
    """
    k = rnd.num_users
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
            alive, ub = _node_bound(builder, alive[rows], admitted, ctx, level, must=must)
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


class Exhaustive(Scheduler):
    """The exact optimum by complete search; for K <= ``max_users`` (default 16)."""

    name = "exhaustive"

    def __init__(self, cost: CostModel, max_gamma: int, draft_depth: int = DEFAULT_DRAFT_DEPTH, seed: int | None = None, max_users: int = 16, time_limit_s: float = 60.0, warm_start: bool = True):
        super().__init__(cost, max_gamma, draft_depth, seed)
        self.max_users = max_users
        self.time_limit_s = time_limit_s
        self.warm_start = warm_start

    def decide(self, rnd: Round) -> Plan:
        if rnd.num_users > self.max_users:
            raise ValueError(f"exhaustive search is limited to num_users <= {self.max_users}, got {rnd.num_users}; use 'optimal'")
        # warm start: BALANCE's count minus one is a valid incumbent (the optimum is at least that)
        g = grid(0.05)
        lb = split_search(self.cost, rnd, self.gamma, g, g).admitted if self.warm_start else 1
        modes, complete, _ = exhaustive_search(self.cost, rnd, self.gamma, incumbent=max(lb - 1, 0), time_limit_s=self.time_limit_s)
        if not complete:
            raise TimeoutError(f"exhaustive search did not finish within time_limit_s={self.time_limit_s}")
        return _plan_from_modes(self.cost, rnd, modes, self.gamma, {"gap": 0, "upper_bound": int(np.count_nonzero(modes)) if modes is not None else 0})


def _plan_from_modes(cost: CostModel, rnd: Round, modes, gamma: int, extra: dict) -> Plan:
    if modes is None:
        return Plan(np.zeros(rnd.num_users, dtype=np.int8), gamma=gamma, z=1.0, lam=1.0, extra=extra)
    rep = check_plans(cost, rnd, modes, gamma)
    return Plan(modes, gamma=gamma, z=float(rep.z), lam=float(rep.lam), extra=extra)


def split_upper_bound(cost: CostModel, rnd: Round, gamma: int, step: float = 0.01, incumbent: int = 0) -> int:
    """Certified upper bound on the optimum with draft depth ``gamma`` (see the module docstring)."""
    k = rnd.num_users
    everyone = np.ones(k, dtype=bool)
    ad_tab = build_table(cost, rnd, AD, gamma)
    sd_tab = build_table(cost, rnd, SD, gamma, optimistic=True)
    rem_sd = float(cost.memory_budget(True))
    ad_only = len(solve_mode(ad_tab, everyone, 1.0, float(cost.memory_budget(False))))
    sd_only = len(solve_mode(sd_tab, everyone, 1.0, rem_sd))
    g = grid(step)
    # cheap bounds first for every cell corner, exact single-mode optima only where needed
    ad_cheap = upper_bound_grid(ad_tab, g, g * rem_sd)  # (z1, l1)
    sd_cheap = upper_bound_grid(sd_tab, 1.0 - g, (1.0 - g) * rem_sd)  # (z0, l0)
    best = max(ad_only, sd_only, incumbent)
    cells = []
    for i in range(len(g) - 1):
        for j in range(len(g) - 1):
            cells.append((int(ad_cheap[i + 1, j + 1] + sd_cheap[i, j]), i, j))
    cells.sort(reverse=True)
    ad_cache: dict = {}
    sd_cache: dict = {}
    bound = max(ad_only, sd_only)
    for cheap, i, j in cells:
        if cheap <= bound:
            break
        a = ad_cache.get((i + 1, j + 1))
        if a is None:
            a = ad_cache[(i + 1, j + 1)] = len(solve_mode(ad_tab, everyone, float(g[i + 1]), float(g[j + 1]) * rem_sd))
        s = sd_cache.get((i, j))
        if s is None:
            s = sd_cache[(i, j)] = len(solve_mode(sd_tab, everyone, 1.0 - float(g[i]), (1.0 - float(g[j])) * rem_sd))
        bound = max(bound, min(a + s, k))
    return max(bound, best if best <= bound else bound)


class Optimal(Scheduler):
    """The optimum, or the best plan found with a proven upper bound, under a time limit.

    Anytime search (:func:`certify`), each stage only while the bound exceeds the best plan:

    1. incumbents: BALANCE (grid step ``incumbent_step``) and any ``warm`` plans (:meth:`solve`),
       the best improved by exchange moves (:mod:`agents.local_search`, at most ``local_search_s``);
    2. the split bound (:func:`split_upper_bound`, grid ``bound_step``; only where the round's
       costs are monotone, which it assumes), then the joint bound (:mod:`agents.joint_bound`:
       the two batches' KV memory charged jointly, so no user counts twice; same condition);
    3. for ``exhaustive_share`` of the time left (default all of it), a descent on the target:
       exhaustive searches for a plan serving ``T`` users, ``T`` falling from the bound (in
       growing steps while proofs come fast); each complete search without a plan proves
       ``T - 1``, a plan found raises the incumbent;
    4. with any time left, the MILP relaxation of :mod:`agents.round_milp`, solved again and
       again with cuts until its optimum passes the exact check or time runs out; its plans are
       repaired into incumbents (:mod:`agents.plan_repair`). Exact on small rounds, but measured
       weaker than stage 3 at K >= 50, hence off by default.

    ``plan.extra``: ``upper_bound``, ``gap``, ``optimal`` and ``certified`` (both ``gap == 0``),
    ``trace`` (``[{"t_s", "lower", "upper", "event"}]``: the best plan and the proven bound after
    every stage or MILP solve, seconds since the start), ``milp_solves`` and ``cuts``.
    """

    name = "optimal"

    def __init__(self, cost: CostModel, max_gamma: int, draft_depth: int = DEFAULT_DRAFT_DEPTH, seed: int | None = None, time_limit_s: float = 10.0, bound_step: float = 0.02, incumbent_step: float = 0.05, exhaustive_share: float = 1.0, local_search_s: float = 2.0):
        super().__init__(cost, max_gamma, draft_depth, seed)
        if not time_limit_s > 0:
            raise ValueError(f"time_limit_s must be > 0, got {time_limit_s}")
        if not 0 <= exhaustive_share <= 1:
            raise ValueError(f"exhaustive_share must be in [0, 1], got {exhaustive_share}")
        self.time_limit_s = float(time_limit_s)
        self.bound_step = bound_step
        self.incumbent_step = incumbent_step
        self.exhaustive_share = exhaustive_share
        if not local_search_s >= 0:
            raise ValueError(f"local_search_s must be >= 0, got {local_search_s}")
        self.local_search_s = float(local_search_s)

    def decide(self, rnd: Round) -> Plan:
        return self.solve(rnd)

    def solve(self, rnd: Round, warm: Sequence[Plan] = ()) -> Plan:
        """:meth:`decide` with extra warm-start plans (e.g. a learned policy's on this round)."""
        start = time.perf_counter()
        g = grid(self.incumbent_step)
        plans = [split_search(self.cost, rnd, self.gamma, g, g), *warm]
        return certify(self.cost, rnd, self.gamma, self.time_limit_s, plans, start, self.bound_step, self.exhaustive_share, self.local_search_s)


def certify(cost: CostModel, rnd: Round, gamma: int, time_limit_s: float, warm: Sequence[Plan] = (), start: float | None = None, bound_step: float = 0.02, exhaustive_share: float = 1.0, local_search_s: float = 0.0, joint_share: float = 1.0) -> Plan:
    """Best plan with draft depth ``gamma`` and a proven upper bound (see :class:`Optimal`).

    ``local_search_s``: at most this many seconds (and 5 % of the time left) of exchange moves on
    the best warm plan (:mod:`agents.local_search`); 0 (the default here) skips the stage.

    ``joint_share``: at most this share of the time left for the joint bound's tests of ``n``
    (:mod:`agents.joint_bound`, after the split bound; 0 skips it). Its tables are built in one go
    (K = 200: some 7 s on a loaded CPU) and its tests are cheap, hence all the time by default.

    Why the bound is valid: it is the minimum of proven bounds -- the split bound; the joint bound; ``T - 1`` for
    every target ``T`` a complete exhaustive search found no plan for; and the value (or HiGHS's dual bound) of the MILP
    relaxation constrained to beat the incumbent (``>= lower + 1``), so the optimum is at most
    ``max(lower, bound)``. Cuts never remove a feasible plan (:mod:`agents.round_milp`).
    """
    start = time.perf_counter() if start is None else start
    k = rnd.num_users
    trace: list[dict] = []
    state = {"best": np.zeros(k, dtype=np.int8), "lower": 0, "upper": k}

    def left() -> float:
        return time_limit_s - (time.perf_counter() - start)

    def offer(modes, event: str | None = None, upper: int | None = None) -> None:
        if modes is not None and np.count_nonzero(modes) > state["lower"] and check_plans(cost, rnd, modes, gamma).feasible:
            state["best"], state["lower"] = np.asarray(modes, dtype=np.int8).copy(), int(np.count_nonzero(modes))
        if upper is not None:
            state["upper"] = min(state["upper"], max(int(upper), state["lower"]))
        if event:
            trace.append({"t_s": round(time.perf_counter() - start, 4), "lower": state["lower"], "upper": state["upper"], "event": event})

    def done() -> bool:
        return state["lower"] >= state["upper"] or left() <= 0

    env = CostEnvelope(cost, rnd, gamma)
    monotone = env.monotone
    for p in warm:  # a warm plan counts only if feasible at this depth (AD-only plans are at any)
        offer(p.modes)
    offer(None, "warm start")
    if not done() and state["lower"] > 0 and local_search_s > 0:  # exchange moves on the best warm plan: cheap, sometimes +1
        better = improve(cost, rnd, state["best"], gamma, min(local_search_s, 0.05 * left()))
        offer(better, "local search" if np.count_nonzero(better) > state["lower"] else None)  # traced when it helps
    if not done() and monotone:
        offer(None, "split bound", split_upper_bound(cost, rnd, gamma, bound_step, incumbent=state["lower"]))
    if not done() and monotone and joint_share > 0:  # each user counted once (agents.joint_bound)
        jb = joint_upper_bound(cost, rnd, gamma, upper=state["upper"], incumbent=state["lower"], time_limit_s=joint_share * left())
        offer(None, "joint bound", jb)
    if not done() and exhaustive_share > 0:
        # descend on the target: a complete search that finds no plan serving >= target proves
        # upper = target - 1, and high targets prune hard. Each step down costs a few times the
        # last, so bigger steps are tried only while proofs are cheap (< 1 % of the time left),
        # and such a try is stopped at 4x the last proof's time; a plan found raises the incumbent.
        stop = time.perf_counter() + left() * exhaustive_share
        step, last_proof_s = 1, 0.0
        while not done() and time.perf_counter() < stop:
            budget = stop - time.perf_counter()
            step = step * 2 if last_proof_s < 0.01 * budget else 1
            target = max(state["lower"] + 1, state["upper"] - step + 1)
            careful = target == state["upper"]  # the cheapest target left: all the time it needs
            t0 = time.perf_counter()
            modes, complete, _ = exhaustive_search(cost, rnd, gamma, incumbent=target - 1, time_limit_s=budget if careful else min(budget, max(4 * last_proof_s, 0.2)), envelope=env)
            if modes is not None:
                offer(modes, f"exhaustive search found {int(np.count_nonzero(modes))}")
            elif complete:
                offer(None, f"exhaustive search: none serves {target}", target - 1)
                last_proof_s = time.perf_counter() - t0
            elif careful:
                offer(None, f"exhaustive search for {target} stopped")
                break
            else:
                last_proof_s = float("inf")  # back to single steps
    solves, cuts = 0, 0
    if not done():
        milp = RoundMILP(cost, rnd, gamma)
        while not done():
            status, modes, bound = milp.solve(left(), at_least=state["lower"] + 1, at_most=state["upper"])
            solves += 1
            if status == "infeasible":
                offer(None, "relaxation cannot beat the incumbent", state["lower"])
                break
            if modes is not None and not check_plans(cost, rnd, modes, gamma).feasible:
                offer(repair(cost, rnd, modes, gamma))
                if status == "optimal":
                    milp.cuts_for(modes)
            else:
                offer(modes)
            offer(None, f"MILP {status}", bound)
            if status == "limit":
                break
        cuts = milp.num_cuts
    lower, upper = state["lower"], max(state["upper"], state["lower"])
    extra = {"upper_bound": int(upper), "gap": int(upper - lower), "optimal": bool(upper == lower), "certified": bool(upper == lower), "trace": trace, "milp_solves": solves, "cuts": cuts}
    return _plan_from_modes(cost, rnd, state["best"], gamma, extra)
