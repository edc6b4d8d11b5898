"""How to run a given set of ED users: their draft depths, and the least compute share and KV it takes.

The exact check of the split mode (``envs.split_plan``) prices the ED batch through its aggregates
only: size, longest input and output, slowest uplink, tightest deadline, longest edge prefill --
all fixed by *which* users are in ED -- and three that the per-user depths ``g_k`` decide: the
padded query width ``q = max g_k + 1``, the most iterations ``J = max J_k(g_k)`` and the slowest
edge iteration ``X = max X_k(g_k)``. The least share is ``C_E(q, J) / (T_min - U - P - J X)`` and
the server KV ``(b (S + q) + sum O) kv_L`` (``per_user``).

:func:`ed_options` finds, for one ED set, every Pareto-optimal ``(share, memory)`` over all depth
assignments, exactly: it enumerates the largest depth ``g`` and the iteration cap ``J*`` (each
user's ``J_k(d)`` values), and lets every user take, among its allowed depths ``d <= g`` with
``J_k(d) <= J*``, the one with the fastest edge iteration ``X_k(d)``. Why this loses nothing: any
feasible assignment ``D`` has some largest depth ``g'`` and iteration maximum ``J'``; at ``(g', J')``
each user's choice has ``X`` no larger than under ``D``, so ``q <= g' + 1``, ``J <= J'`` and
``X <= X'``; ``C_E`` rises with ``q`` and ``J`` (``tau`` is non-decreasing), the budget falls with
``J X`` and the memory rises with ``q`` -- so the choice needs no more share and no more memory
than ``D``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from envs.cost_model import CostModel
from envs.profile import Profile
from envs.split_cost import SplitCostModel
from envs.split_plan import (
    EdUsers,
    ed_aggregates,
    ed_budget,
    ed_memory,
    ed_share,
    ed_time,
    ed_users,
)
from envs.workload import Round


def split_model(profile: Profile) -> SplitCostModel | None:
    """The split-mode cost model of a profile with ``edge`` and ``network`` sections, else None (no ED)."""
    return SplitCostModel(profile) if profile.edge is not None and profile.network is not None else None


def round_ed_users(split: SplitCostModel | None, rnd: Round, max_gamma: int) -> EdUsers:
    """``envs.split_plan.ed_users``; where the profile has no edge (``split`` None) no user may run ED."""
    if split is not None:
        return ed_users(split, rnd, max_gamma)
    k, g = rnd.num_users, int(max_gamma)
    return EdUsers(np.ones((k, g)), np.zeros((k, g), dtype=np.int64), np.zeros((k, g)), np.zeros((k, g), dtype=bool), np.zeros(k))


@dataclass(frozen=True)
class EdOption:
    """One way to run an ED set: per-user depths (aligned with the set's indices) and what it takes."""

    depth: np.ndarray
    share: float  #: least compute share C_E / beta_E (inf: no share is enough)
    memory_bytes: float


def ed_options(cost: CostModel, users: EdUsers, rnd: Round, idx: np.ndarray) -> list[EdOption]:
    """The Pareto-optimal ``(share, memory)`` ways to run ED users ``idx`` (empty if none is feasible).

    Sorted by share ascending (memory then descending). Users not allowed at any depth make the
    set infeasible. ``cost`` is the round's ``CostModel``.
    """
    idx = np.asarray(idx, dtype=np.int64)
    if len(idx) == 0:
        return [EdOption(np.zeros(0, dtype=np.int64), 0.0, 0.0)]
    g_max = users.tokens.shape[1]
    allowed = users.allowed[idx]  # (b, G)
    if not allowed.any(axis=1).all():
        return []
    iters = users.iterations[idx]
    edge = users.edge_s[idx]
    b = len(idx)
    s_max = int(rnd.input_tokens[idx].max())
    n_max = int(rnd.output_tokens[idx].max())
    u_max = float(rnd.uplink_s[idx].max())
    t_min = float(rnd.deadline_s[idx].min())
    p_max = float(users.prefill_s[idx].max())
    sum_out = int(rnd.output_tokens[idx].sum())
    found: list[tuple[float, float, np.ndarray]] = []
    rows = np.arange(b)
    for g in range(1, g_max + 1):
        ok_g = allowed[:, :g]
        if not ok_g.any(axis=1).all():
            continue
        caps = np.unique(iters[:, :g][ok_g])  # candidate J*
        ok = ok_g[None, :, :] & (iters[None, :, :g] <= caps[:, None, None])  # (nJ, b, g)
        feasible_cap = ok.any(axis=2).all(axis=1)
        if not feasible_cap.any():
            continue
        caps, ok = caps[feasible_cap], ok[feasible_cap]
        x = np.where(ok, edge[None, :, :g], np.inf)
        depth_idx = np.argmin(x, axis=2)  # (nJ, b): fastest edge iteration; ties -> the shallower
        x_max = np.take_along_axis(x, depth_idx[:, :, None], axis=2)[:, :, 0].max(axis=1)
        j_max = iters[rows[None, :], depth_idx].max(axis=1)
        q_max = depth_idx.max(axis=1) + 2  # depth = index + 1, q = depth + 1
        c_e = ed_time(cost, b, s_max, n_max, j_max, q_max)
        share = ed_share(c_e, b, ed_budget(t_min, u_max, p_max, j_max, x_max))
        mem = ed_memory(cost, b, s_max, n_max, sum_out, q_max)
        for k in np.flatnonzero(np.isfinite(share)):
            found.append((float(share[k]), float(mem[k]), depth_idx[k] + 1))
    found.sort(key=lambda t: (t[0], t[1]))
    pareto: list[EdOption] = []
    best_mem = np.inf
    for share, mem, depth in found:
        if mem < best_mem:
            pareto.append(EdOption(depth.astype(np.int64), share, mem))
            best_mem = mem
    return pareto


def cheapest_option(options: list[EdOption], share_left: float, memory_left: float, eps: float = 1e-9) -> EdOption | None:
    """The least-share option that fits ``share_left`` and ``memory_left`` bytes, else None."""
    for opt in options:  # sorted by share ascending
        if opt.share <= share_left + eps and opt.memory_bytes <= memory_left * (1 + eps):
            return opt
    return None


def fixed_depth_option(cost: CostModel, users: EdUsers, rnd: Round, idx: np.ndarray, depth: np.ndarray) -> EdOption:
    """What ED users ``idx`` take at the given depths (``depth`` aligned with ``idx``; share inf if not allowed)."""
    idx = np.asarray(idx, dtype=np.int64)
    depth = np.asarray(depth, dtype=np.int64)
    if len(idx) == 0:
        return EdOption(depth, 0.0, 0.0)
    if not users.allowed[idx, depth - 1].all():
        return EdOption(depth, float("inf"), float("inf"))
    agg = ed_aggregates(users, rnd, idx, depth)
    c_e = ed_time(cost, agg["b"], agg["s_max"], agg["n_max"], agg["j_max"], agg["q_max"])
    share = float(ed_share(c_e, agg["b"], ed_budget(agg["t_min"], agg["u_max"], agg["p_max"], agg["j_max"], agg["x_max"])))
    mem = float(ed_memory(cost, agg["b"], agg["s_max"], agg["n_max"], agg["sum_out"], agg["q_max"]))
    return EdOption(depth, share, mem)
