"""BALANCE extended to three modes: AD, SD and ED (SpecEdge's split: the user's edge drafts, the server verifies).

**How the per-mode enumeration is extended.** BALANCE enumerates the AD/SD split ``(z, lam)`` and
solves each mode exactly (``agents.mode_solver``). ED's batch adds aggregates the threshold
enumeration does not cover (per-user depths, edge iteration times, edge prefills; see
``envs.split_plan``), so ED is placed *around* BALANCE rather than inside it:

1. **The ED set.** Candidate ED sets form two nested families: edge-capable users sorted by the
   least share each would need alone in ED (ascending), added one at a time when the set stays
   feasible on the whole server (:func:`nested_ed_sets`); and the same grown from only the
   edge-capable users BALANCE's own plan rejects (ED first for those AD/SD cannot serve).
   ``max_ed_sets`` of each family (evenly spaced, always including the empty set and the
   largest) are tried.
2. **The ED depths** of a set are chosen exactly (``agents.ed_batch``: the depths that minimise
   the set's share; no assignment needs less share or less memory).
3. **AD and SD on the rest**: BALANCE's grid search over ``(z, lam)`` with the compute share and
   KV memory the ED batch leaves (:func:`split_search_within`): AD gets ``z (1 - zeta_E)``, SD
   ``(1 - z)(1 - zeta_E)``, the KV budget is reduced by the ED batch's memory.
4. The plan serving most users wins; ties keep the earlier (the empty set first).

**What is exact and what is not.** Given the ED set, steps 2 and 3 are BALANCE's own guarantees
(AD and SD per-mode solves exact; the grid over ``(z, lam)``). The ED set itself is a heuristic
(a nested family, not all subsets): no optimality claim is made for it. Because the empty ED set
is always tried first, the plan serves at least as many users as BALANCE; with no edge-capable
user it *is* BALANCE's plan (``tests/test_specedge_schedulers.py`` holds both).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from numpy.typing import ArrayLike

from agents.balance import Balance, grid, search_splits, split_search
from agents.ed_batch import EdOption, cheapest_option, ed_options, round_ed_users, split_model
from envs.cost_model import CostModel
from envs.plan import ED, REJECT, Plan
from envs.split_plan import EdUsers, check_plan_split
from envs.workload import Round


def split_search_within(cost: CostModel, rnd: Round, gamma: int, z_values: ArrayLike, lam_values: ArrayLike, share_total: float, memory_taken: float) -> tuple[np.ndarray, float, float]:
    """BALANCE's ``(z, lam)`` search over ``rnd``'s users with ``share_total`` of the GPU and
    ``memory_taken`` bytes of KV already used elsewhere: ``(modes, z, lam)`` of the best plan.

    ``agents.balance.search_splits`` on a scaled budget: AD gets ``z * share_total``, SD
    ``(1 - z) * share_total``, the KV budgets are reduced by ``memory_taken``. At ``share_total = 1``
    and ``memory_taken = 0`` it chooses the same users as ``split_search``. Callers pass the
    sub-round of the users left (``Round.subset``), so the per-mode tables and bounds are the
    sub-round's own.
    """
    modes = np.zeros(rnd.num_users, dtype=np.int8)
    if share_total <= 0 or rnd.num_users == 0:
        return modes, 1.0, 1.0
    choice = search_splits(cost, rnd, gamma, z_values, lam_values, share_total, memory_taken)
    if choice is None:
        return modes, 1.0, 1.0
    return choice.modes, choice.z, choice.lam


def modes_for_rest(cost: CostModel, rnd: Round, gamma: int, z_values: ArrayLike, lam_values: ArrayLike, ed_idx: np.ndarray, option: EdOption) -> np.ndarray:
    """AD/SD modes (K,) for the users not in ``ed_idx``, by BALANCE within what ED ``option`` leaves."""
    rest = np.setdiff1d(np.arange(rnd.num_users), ed_idx)
    modes = np.zeros(rnd.num_users, dtype=np.int8)
    if len(rest):
        sub, _, _ = split_search_within(cost, rnd.subset(rest), gamma, z_values, lam_values, 1.0 - option.share, option.memory_bytes)
        modes[rest] = sub
    return modes


def nested_ed_sets(cost: CostModel, users: EdUsers, rnd: Round, share_total: float = 1.0) -> list[np.ndarray]:
    """Growing ED sets: edge-capable users by their least share alone (ascending), each added if
    the set stays feasible with ``share_total`` of the GPU and the AD-only KV budget. Starts with ``[]``."""
    cand = np.flatnonzero(users.allowed.any(axis=1))
    if len(cand) == 0:
        return [np.zeros(0, dtype=np.int64)]
    alone = np.array([min((o.share for o in ed_options(cost, users, rnd, np.array([k]))), default=np.inf) for k in cand])
    by_share = np.argsort(alone, kind="stable")
    order = cand[by_share][np.isfinite(alone[by_share])]
    mem = float(cost.memory_budget(False))
    sets, current = [np.zeros(0, dtype=np.int64)], []
    for k in order:
        trial = np.array(current + [int(k)], dtype=np.int64)
        if cheapest_option(ed_options(cost, users, rnd, trial), share_total, mem) is not None:
            current.append(int(k))
            sets.append(np.sort(trial))
    return sets


def spaced(items: list, most: int) -> list:
    """At most ``most`` items, evenly spaced, always keeping the first and the last."""
    if len(items) <= most:
        return list(items)
    pick = np.unique(np.round(np.linspace(0, len(items) - 1, most)).astype(int))
    return [items[i] for i in pick]


def plan_with_ed(cost: CostModel, users: EdUsers, rnd: Round, gamma: int, ed_idx: np.ndarray, option: EdOption, modes_rest: np.ndarray) -> Plan:
    """The v1 plan of AD/SD modes ``modes_rest`` plus ED users ``ed_idx`` at ``option``'s depths, with
    shares from the exact check (``envs.split_plan``)."""
    modes = modes_rest.copy()
    depth = np.zeros(rnd.num_users, dtype=np.int64)
    modes[ed_idx] = ED
    depth[ed_idx] = option.depth
    rep = check_plan_split(cost, users, rnd, modes, gamma, depth)
    return Plan(modes, gamma=gamma, z=rep.z, lam=rep.lam, ed_depth=depth if len(ed_idx) else None, ed_share=rep.ed_share if len(ed_idx) else 0.0)


class BalanceED(Balance):
    """BALANCE with the ED mode (module docstring); on a profile without ``edge`` / ``network`` sections, BALANCE."""

    name = "balance_ed"
    max_ed_sets = 6  #: ED sets tried per round (evenly spaced along the nested family)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.split = split_model(self.cost.profile)  # None: the profile has no edge, so no user runs ED

    def decide(self, rnd: Round) -> Plan:
        users = round_ed_users(self.split, rnd, self.max_gamma)
        # the empty ED set first: BALANCE itself, its own plan, shares and all
        best_plan = split_search(self.cost, rnd, self.gamma, self._z, self._lam)
        best_n = best_plan.admitted
        rejected = replace(users, allowed=users.allowed & (best_plan.modes == REJECT)[:, None])
        families = (nested_ed_sets(self.cost, users, rnd), nested_ed_sets(self.cost, rejected, rnd))
        for ed_idx in (s for family in families for s in spaced(family, self.max_ed_sets)[1:]):
            option = cheapest_option(ed_options(self.cost, users, rnd, ed_idx), 1.0, float(self.cost.memory_budget(False)))
            if option is None:
                continue
            modes = modes_for_rest(self.cost, rnd, self.gamma, self._z, self._lam, ed_idx, option)
            n = int(np.count_nonzero(modes)) + len(ed_idx)
            if n > best_n:
                best_n = n
                best_plan = plan_with_ed(self.cost, users, rnd, self.gamma, ed_idx, option, modes)
        return best_plan


__all__ = ["BalanceED", "grid", "modes_for_rest", "nested_ed_sets", "split_search_within"]
