"""The exact optimum of a round, and proven upper bounds where it is out of reach.

* :class:`Exhaustive` (K <= 16): the exhaustive search (:func:`agents.exact_search.exhaustive_search`:
  depth-first branch and bound with the exact incremental check), run to completion.
* :func:`split_upper_bound`: a certified upper bound from the single-mode optima over a grid of
  compute and memory shares.
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
from agents.exact_search import exhaustive_search
from agents.joint_bound import joint_upper_bound
from agents.local_search import improve
from agents.mode_solver import build_table, solve_mode, upper_bound_grid
from agents.plan_repair import repair
from agents.round_milp import RoundMILP
from agents.scheduler import Scheduler
from envs.cost_model import CostModel
from envs.feasibility import check_plans
from envs.plan import AD, DEFAULT_DRAFT_DEPTH, SD, Plan
from envs.workload import Round


class Exhaustive(Scheduler):
    """The exact optimum by complete search; for K <= ``max_users`` (default 16)."""

    name = "exhaustive"
    max_users = 16

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
    """Certified upper bound on the optimum with draft depth ``gamma`` (see the module docstring).

    ``incumbent`` (users served by a plan already found) prunes: once every cell left has a cheap
    bound of at most ``incumbent``, their exact solves cannot raise the answer above it, so the
    largest cheap bound left stands in for them. The result is still a valid bound whatever
    ``incumbent`` is; it equals the unpruned one whenever either exceeds ``incumbent``, so a caller
    certifying ``bound <= incumbent`` decides exactly as without pruning."""
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
    cells = []
    for i in range(len(g) - 1):
        for j in range(len(g) - 1):
            cells.append((int(ad_cheap[i + 1, j + 1] + sd_cheap[i, j]), i, j))
    cells.sort(reverse=True)
    bound = max(ad_only, sd_only)
    for cheap, i, j in cells:  # each cell once: its two exact solves are its own (no cache to share)
        if cheap <= bound:
            break
        if cheap <= incumbent:  # cells are in descending cheap bound: none left can beat the incumbent
            bound = max(bound, cheap)
            break
        a = len(solve_mode(ad_tab, everyone, float(g[i + 1]), float(g[j + 1]) * rem_sd))
        s = len(solve_mode(sd_tab, everyone, 1.0 - float(g[i]), (1.0 - float(g[j])) * rem_sd))
        bound = max(bound, min(a + s, k))
    return bound


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
    (K = 200: some 6-8 s, the per-row step included) and its tests take seconds at most (up to ~10 s at
    K = 200 when many combinations pass the union filter), hence all the time by default.

    Why the bound is valid: it is the minimum of proven bounds -- the split bound; the joint bound; ``T - 1`` for
    every target ``T`` a complete exhaustive search found no plan for; and the value (or HiGHS's dual bound) of the MILP
    relaxation constrained to beat the incumbent (``>= lower + 1``), so the optimum is at most
    ``max(lower, bound)``. Cuts never remove a feasible plan (:mod:`agents.round_milp`).
    """
    start = time.perf_counter() if start is None else start
    k = rnd.num_users
    trace: list[dict] = []
    state = {"best": np.zeros(k, dtype=np.int8), "lower": 0, "upper": k}
    if k == 0:  # nothing to decide: the empty plan is optimal (and the envelope needs a user)
        trace.append({"t_s": round(time.perf_counter() - start, 4), "lower": 0, "upper": 0, "event": "no users"})
        extra = {"upper_bound": 0, "gap": 0, "optimal": True, "certified": True, "trace": trace, "milp_solves": 0, "cuts": 0}
        return _plan_from_modes(cost, rnd, state["best"], gamma, extra)

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
