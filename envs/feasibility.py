"""The exact feasibility check: can a plan run on the edge server, and with which shares.

Everything that decides "can this plan run, and with which shares" is built on this check and the
cost model (:mod:`envs.cost_model`, whose docstring has the batch times ``C_A``, ``C_S``, the memory
and the budget); the environment, every scheduler, the exact optimum and the live runtime use it
(DESIGN.md §1). The incremental, one-user-at-a-time version is :mod:`envs.plan_builder`.

Exact check (no search over z and lambda): with budgets ``beta_m = min_m (T_k - t_d,k) - max_m t_u,k``,
a plan is feasible iff the memory fits and every non-empty mode has ``beta_m > 0`` and
``C_A / beta_A + C_S / beta_S <= 1``. Removing a user never breaks feasibility.

Why this is exact: AD and SD share the GPU by time (AD gets ``z``, SD ``1 - z``) and the KV memory
by ``lam``. Mode ``m`` finishes in time iff its batch time at its share, ``C_m / share_m``, fits
in its tightest budget ``beta_m``, i.e. ``share_m >= C_m / beta_m``; a ``z`` exists iff the two
least shares sum to at most 1, and a ``lam`` iff the two memories sum to at most the budget -- so
no search over ``z`` and ``lam`` is needed (:func:`shares_for` picks one). Removing a user can only
lower ``C_m`` and the memory and raise ``beta_m``, so feasible plans are downward closed. ``EPS``
is the only tolerance, on the float sums.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from envs.cost_model import CostModel, sd_iterations
from envs.plan import AD, SD, Plan
from envs.workload import Round

EPS = 1e-9  #: float tolerance on the share and memory sums (the check is otherwise exact)


@dataclass
class BatchStats:
    """Aggregates of one mode's batch; arrays broadcast over plans. Empty batch: b = 0."""

    b: np.ndarray
    s_max: np.ndarray  #: longest input (tokens)
    n_max: np.ndarray  #: longest predicted output (tokens)
    j_max: np.ndarray  #: most SD iterations (SD only)
    u_max: np.ndarray  #: slowest uplink (s)
    slack_min: np.ndarray  #: min over users of T_k - t_d,k (s)
    sum_out: np.ndarray  #: sum of predicted outputs (tokens)

    @classmethod
    def of(cls, rnd: Round, mask: np.ndarray, gamma: ArrayLike) -> BatchStats:
        """Aggregates of the users where ``mask`` is true (``mask`` is (K,) or (P, K))."""
        m = np.asarray(mask, dtype=bool)
        j = sd_iterations(rnd.output_tokens, rnd.alpha, np.asarray(gamma)[..., None] if np.ndim(gamma) else gamma)

        def mx(x):
            return np.where(m, x, 0).max(axis=-1, initial=0)

        return cls(
            b=m.sum(axis=-1),
            s_max=mx(rnd.input_tokens),
            n_max=mx(rnd.output_tokens),
            j_max=mx(j),
            u_max=np.where(m, rnd.uplink_s, 0.0).max(axis=-1, initial=0.0),
            slack_min=np.where(m, rnd.slack_s, np.inf).min(axis=-1, initial=np.inf),
            sum_out=np.where(m, rnd.output_tokens, 0).sum(axis=-1),
        )


@dataclass
class FeasibilityReport:
    """Result of the exact check for one plan (or arrays of them, from :func:`check_plans`)."""

    feasible: np.ndarray
    ad_time_s: np.ndarray  #: C_A
    sd_time_s: np.ndarray  #: C_S
    ad_share_min: np.ndarray  #: C_A / beta_A (0 if AD empty, inf if its budget is <= 0)
    sd_share_min: np.ndarray
    ad_memory_bytes: np.ndarray
    sd_memory_bytes: np.ndarray
    memory_budget_bytes: np.ndarray
    z: np.ndarray  #: a valid AD compute share (see :func:`shares_for`)
    lam: np.ndarray  #: a valid AD memory share


def share_needed(time_s: ArrayLike, b: ArrayLike, u_max: ArrayLike, slack_min: ArrayLike) -> np.ndarray:
    """``C_m / beta_m``: the least compute share a batch needs (0 if empty, inf if its budget is <= 0)."""
    budget = slack_min - u_max
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(budget > 0, time_s / np.where(budget > 0, budget, 1.0), np.inf)
    return np.where(b > 0, r, 0.0)


def share_needed1(time_s: float, b: int, u_max: float, slack_min: float) -> float:
    """:func:`share_needed` for one batch, in Python floats (the incremental builders' hot path)."""
    if b <= 0:
        return 0.0
    budget = slack_min - u_max
    return time_s / budget if budget > 0 else math.inf


def shares_for(ad_share_min: ArrayLike, sd_share_min: ArrayLike, ad_mem: ArrayLike, sd_mem: ArrayLike, b_ad: ArrayLike, b_sd: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """A valid ``(z, lam)`` for a feasible plan: the slack left over is split in proportion.

    Any ``z`` in ``[C_A/beta_A, 1 - C_S/beta_S]`` works; proportional splitting gives both modes
    the same relative head-room against prediction error. An empty mode gets share 0.
    """
    ra, rs = np.asarray(ad_share_min, dtype=float), np.asarray(sd_share_min, dtype=float)
    ma, ms = np.asarray(ad_mem, dtype=float), np.asarray(sd_mem, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(b_sd == 0, 1.0, np.where(b_ad == 0, 0.0, ra / np.maximum(ra + rs, 1e-300)))
        lam = np.where(b_sd == 0, 1.0, np.where(b_ad == 0, 0.0, ma / np.maximum(ma + ms, 1e-300)))
    return z, lam


def check_plans(cost: CostModel, rnd: Round, modes: np.ndarray, gamma: ArrayLike) -> FeasibilityReport:
    """The exact check for one plan (``modes`` shape (K,)) or many (shape (P, K)) at once."""
    modes = np.asarray(modes)
    ad = BatchStats.of(rnd, modes == AD, gamma)
    sd = BatchStats.of(rnd, modes == SD, gamma)
    c_a = cost.ad_time(ad.b, ad.s_max, ad.n_max)
    c_s = cost.sd_time(sd.b, sd.s_max, sd.n_max, sd.j_max, gamma)
    r_a = share_needed(c_a, ad.b, ad.u_max, ad.slack_min)
    r_s = share_needed(c_s, sd.b, sd.u_max, sd.slack_min)
    m_a = cost.ad_memory(ad.b, ad.s_max, ad.n_max, ad.sum_out)
    m_s = np.where(sd.b > 0, cost.sd_memory(sd.b, sd.s_max, sd.n_max, sd.sum_out, gamma), 0.0)
    budget = cost.memory_budget(sd.b > 0)
    feasible = (r_a + r_s <= 1.0 + EPS) & (m_a + m_s <= budget * (1 + EPS)) & (budget >= 0)
    z, lam = shares_for(r_a, r_s, m_a, m_s, ad.b, sd.b)
    return FeasibilityReport(feasible, c_a, c_s, r_a, r_s, m_a, m_s, budget, z, lam)


def check_plan(cost: CostModel, rnd: Round, plan_or_modes: Plan | np.ndarray, gamma: int | None = None) -> FeasibilityReport:
    """The exact check for one plan (a :class:`Plan` or a modes array with ``gamma``)."""
    if isinstance(plan_or_modes, Plan):
        return check_plans(cost, rnd, plan_or_modes.modes, plan_or_modes.gamma)
    return check_plans(cost, rnd, plan_or_modes, 4 if gamma is None else gamma)


def shares_respected(cost: CostModel, rnd: Round, plan: Plan) -> bool:
    """Whether the plan's own ``z`` and ``lam`` (not just some shares) make every batch fit."""
    rep = check_plans(cost, rnd, plan.modes, plan.gamma)
    b_a, b_s = plan.admitted_ad, plan.admitted_sd
    ok_time = (b_a == 0 or rep.ad_share_min <= plan.z * (1 + EPS)) and (b_s == 0 or rep.sd_share_min <= (1 - plan.z) * (1 + EPS))
    mem = rep.memory_budget_bytes
    ok_mem = rep.ad_memory_bytes <= plan.lam * mem * (1 + EPS) + 1e-6 and rep.sd_memory_bytes <= (1 - plan.lam) * mem * (1 + EPS) + 1e-6
    return bool(ok_time and ok_mem and mem >= 0)
