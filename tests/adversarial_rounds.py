"""Brute-force oracles and adversarial rounds for the per-mode solver and BALANCE (small K only).

Random rounds almost never put a deadline between two nearby batch costs, so a solver that prices
a batch slightly wrong (an extra SD iteration, a missing ``+gamma``, the longest output of users it
did not pick) still returns the right count on them. The rounds built here do put deadlines there:

* every user's time budget ``slack - uplink`` is placed strictly inside a window between two
  consecutive *candidate costs* (the exact AD and SD cost of every subset, and the SD cost priced
  with the longest output of the subset's input/iteration box), divided by a compute share from
  BALANCE's grid;
* or a random subset's budget is placed between its exact SD cost and that box-priced cost;
* optionally the KV budget equals one subset's exact memory need (memory binds at the limit).

The oracles enumerate every subset (or every plan) with the project's exact feasibility formulas
(``envs.feasibility``), never with the solver under test.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from envs.config import EnvConfig
from envs.cost_model import CostModel, sd_iterations
from envs.feasibility import EPS, BatchStats, check_plans
from envs.plan import AD, SD
from envs.workload import Round

GRID_SHARES = np.round(np.linspace(0.05, 1.0, 20), 10)  #: BALANCE's default compute shares (> 0)


def subset_masks(k: int) -> np.ndarray:
    """All ``2^k`` subsets of ``k`` users as a (2^k, k) bool array (row 0 is the empty set)."""
    return ((np.arange(2**k)[:, None] >> np.arange(k)[None, :]) & 1).astype(bool)


def mode_cost_and_memory(cost: CostModel, rnd: Round, masks: np.ndarray, mode: int, gamma: int):
    """Exact batch time (s), needed share and KV bytes of each subset in ``masks`` run in ``mode``."""
    st = BatchStats.of(rnd, masks, gamma)
    if mode == AD:
        c = cost.ad_time(st.b, st.s_max, st.n_max)
        m = cost.ad_memory(st.b, st.s_max, st.n_max, st.sum_out)
    else:
        c = cost.sd_time(st.b, st.s_max, st.n_max, st.j_max, gamma)
        m = np.where(st.b > 0, cost.sd_memory(st.b, st.s_max, st.n_max, st.sum_out, gamma), 0.0)
    budget = st.slack_min - st.u_max
    with np.errstate(divide="ignore", invalid="ignore"):
        need = np.where(budget > 0, c / np.where(budget > 0, budget, 1.0), np.inf)
    need = np.where(st.b > 0, need, 0.0)
    return np.asarray(c, dtype=float), need, np.asarray(m, dtype=float)


def best_single_mode(cost: CostModel, rnd: Round, mode: int, gamma: int, share: float, mem_bytes: float, avail=None) -> tuple[int, np.ndarray]:
    """Largest subset of ``avail`` servable in ``mode`` with compute ``share`` and ``mem_bytes`` of KV.

    Returns ``(size, mask)``; the same tolerances as the solver (``EPS``, relative).
    """
    k = rnd.num_users
    masks = subset_masks(k)
    if avail is not None:
        masks = masks[~(masks & ~np.asarray(avail, dtype=bool)[None, :]).any(axis=1)]
    if share <= 0 or mem_bytes <= 0:
        return 0, np.zeros(k, dtype=bool)
    _, need, mem = mode_cost_and_memory(cost, rnd, masks, mode, gamma)
    ok = (need <= share * (1 + EPS)) & (mem <= mem_bytes * (1 + EPS))
    sizes = np.where(ok, masks.sum(axis=1), -1)
    i = int(np.argmax(sizes))
    return int(sizes[i]), masks[i]


def all_plans(k: int) -> np.ndarray:
    """Every assignment of ``k`` users to {reject, AD, SD}: (3^k, k) int8."""
    return np.array(list(itertools.product((0, AD, SD), repeat=k)), dtype=np.int8).reshape(-1, k)


def brute_force_optimum(cost: CostModel, rnd: Round, gamma: int) -> int:
    """The most users any feasible plan serves, by the exact check on all ``3^K`` plans."""
    modes = all_plans(rnd.num_users)
    rep = check_plans(cost, rnd, modes, gamma)
    return int(np.where(rep.feasible, (modes != 0).sum(axis=1), 0).max())


def box_priced_sd_cost(cost: CostModel, rnd: Round, masks: np.ndarray, gamma: int) -> np.ndarray:
    """SD cost of each subset priced with the longest output of *every* user in its input/iteration box.

    This is what the pre-fix solver charged; deadlines between it and the exact cost expose it.
    """
    st = BatchStats.of(rnd, masks, gamma)
    j = sd_iterations(rnd.output_tokens, rnd.alpha, gamma)
    in_box = (rnd.input_tokens[None, :] <= st.s_max[:, None]) & (j[None, :] <= st.j_max[:, None])
    n_box = np.where(in_box, rnd.output_tokens[None, :], 0).max(axis=1)
    return np.asarray(cost.sd_time(st.b, st.s_max, n_box, st.j_max, gamma), dtype=float)


@dataclass
class AdversarialCase:
    rnd: Round
    cost: CostModel  #: may carry a memory budget that binds exactly
    target_kv_bytes: float | None  #: the subset footprint the memory budget was set to (None: not tight)
    target_mode: int  #: the mode whose footprint set the budget


def adversarial_round(rng: np.random.Generator, cfg: EnvConfig, cost: CostModel, k: int, gamma: int = 4, tight_memory: bool = False, shares=None) -> AdversarialCase:
    """A round of ``k`` users whose time budgets sit inside windows between candidate costs.

    ``shares``: the compute shares the windows are scaled for (default: 1 half of the time, else
    a point of BALANCE's grid).
    """

    def pick_share() -> float:
        if shares is not None:
            return float(rng.choice(np.asarray(shares, dtype=float)))
        return 1.0 if rng.random() < 0.5 else float(rng.choice(GRID_SHARES))

    # few distinct inputs (ties, as in the issue's counterexample), outputs spread out, acceptance
    # at both ends so that short low-acceptance and long high-acceptance outputs share J
    pool = rng.integers(1, 160, size=int(rng.integers(1, 4)))
    inp = rng.choice(pool, size=k)
    out = rng.integers(1, 160, size=k)
    alpha = np.where(rng.random(k) < 0.5, rng.uniform(0.6, 0.7, size=k), rng.uniform(0.85, 0.95, size=k))
    dist = np.sqrt(rng.uniform(cfg.min_distance_m**2, cfg.cell_radius_m**2, size=k))
    rnd = Round.from_arrays(cfg, inp, out, np.ones(k), alpha, dist)
    masks = subset_masks(k)[1:]
    c_ad, _, m_ad = mode_cost_and_memory(cost, rnd, masks, AD, gamma)
    c_sd, _, m_sd = mode_cost_and_memory(cost, rnd, masks, SD, gamma)
    c_box = box_priced_sd_cost(cost, rnd, masks, gamma)
    budget = np.empty(k)
    if rng.random() < 0.5:
        # every user in some window between consecutive candidate costs at a grid share
        values = np.unique(np.concatenate([c_ad, c_sd, c_box]))
        # drop windows narrower than 1e-6 (relative): a budget there would sit within float
        # tolerance of a cost, where the solver and the oracle may legitimately round apart
        values = values[np.concatenate([[True], np.diff(values) > 1e-6 * values[1:]])]
        for u in range(k):
            v = values / pick_share()
            i = int(rng.integers(0, len(v) - 1)) if len(v) > 1 else 0
            hi = v[i + 1] if len(v) > 1 else 2 * v[0]
            budget[u] = v[i] + rng.uniform(0.1, 0.9) * (hi - v[i])
    else:
        # users either hopeless (they still widen the old solver's box) or loose, then one subset
        # squeezed between its exact SD cost and its box price
        share = pick_share()
        loose = rng.random(k) < 0.2
        budget[:] = np.where(loose, rng.uniform(1.0, 3.0, size=k) * c_box.max(), c_sd.min() / 10) / share
        gap = np.flatnonzero(c_box > c_sd * (1 + 1e-6))
        x = int(rng.choice(gap)) if len(gap) else int(rng.integers(len(masks)))
        lo = c_sd[x] / share
        hi = (c_box[x] if c_box[x] > c_sd[x] * (1 + 1e-6) else c_sd[x] * 1.05) / share
        budget[masks[x]] = lo + rng.uniform(0.1, 0.9, size=int(masks[x].sum())) * (hi - lo)
    rnd.deadline_s = rnd.uplink_s + rnd.downlink_s + budget
    target, mode = None, SD
    if tight_memory:
        mode = AD if rng.random() < 0.5 else SD
        x = int(rng.integers(len(masks)))
        target = float((m_ad if mode == AD else m_sd)[x])
        p = cost.profile
        # budget with the draft loaded = exactly the subset's KV need
        memory = target + p.device.reserve_bytes + p.llm.weight_bytes + p.slm.weight_bytes
        cost = CostModel(p.with_memory(memory), cost.kv_memory)
    return AdversarialCase(rnd, cost, target, mode)


def issue_counterexample(cfg: EnvConfig, cost: CostModel, gamma: int = 4) -> Round:
    """Issue 10's first round: equal inputs, the same SD iteration count, one short low-acceptance
    output and one long high-acceptance output; the first user's deadline lies between the SD
    cost at its own output length and the cost at the other's. The optimum serves 1.
    """
    inp = np.array([100, 100])
    alpha = np.array([0.6, 0.95])
    j_long = int(sd_iterations(np.array([160]), alpha[1:], gamma)[0])
    # the short user's output: the longest with the same iteration count as the long user
    outs = np.arange(1, 161)
    same = outs[sd_iterations(outs, np.full(160, alpha[0]), gamma) == j_long]
    out = np.array([int(same.max()) if len(same) else 40, 160])
    rnd = Round.from_arrays(cfg, inp, out, np.ones(2), alpha, np.array([100.0, 100.0]))
    j = sd_iterations(out, alpha, gamma)
    own = float(cost.sd_time(1, 100, out[0], j[0], gamma))
    other = float(cost.sd_time(1, 100, out[1], max(j), gamma))
    rnd.deadline_s = rnd.uplink_s + rnd.downlink_s + np.array([(own + other) / 2, own / 10])
    return rnd


def mixed_round(rng: np.random.Generator, cfg: EnvConfig, cost: CostModel, k: int, gamma: int = 4) -> Round:
    """A round whose best plan usually needs both modes.

    Half the users draft badly (acceptance near 0: many SD iterations), half draft well. The
    good drafters' budgets fit their own SD batch on a share ``1 - z`` and the bad drafters' fit
    their own AD batch on ``z`` (``z`` a point of a 0.1 grid), so the mixed plan serves everyone,
    while one SD batch holding both runs the bad drafters' iteration count and misses the good
    drafters' deadlines. BALANCE's grid pruning then decides between points that really differ.
    """
    inp = rng.integers(1, 160, size=k)
    out = rng.integers(20, 160, size=k)
    good = rng.permutation(k) < max(k // 2, 1)
    alpha = np.where(good, rng.uniform(0.9, 0.95, size=k), rng.uniform(0.0, 0.2, size=k))
    dist = np.sqrt(rng.uniform(cfg.min_distance_m**2, cfg.cell_radius_m**2, size=k))
    rnd = Round.from_arrays(cfg, inp, out, np.ones(k), alpha, dist)
    z = float(rng.choice([0.3, 0.4, 0.5, 0.6]))
    st_sd = BatchStats.of(rnd, good, gamma)
    st_ad = BatchStats.of(rnd, ~good, gamma)
    c_sd = float(cost.sd_time(st_sd.b, st_sd.s_max, st_sd.n_max, st_sd.j_max, gamma))
    c_ad = float(cost.ad_time(st_ad.b, st_ad.s_max, st_ad.n_max))
    # a little head-room (uplinks differ by milliseconds) over the group's own batch
    budget = np.where(good, c_sd / (1.0 - z), c_ad / z) * rng.uniform(1.02, 1.1, size=k)
    rnd.deadline_s = rnd.uplink_s + rnd.downlink_s + budget
    return rnd
