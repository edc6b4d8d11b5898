"""``edge_first``: every edge-capable user to ED at its calibrated depth, the rest by BALANCE.

SpecEdge's own policy carried into a round: a user with an edge GPU drafts on it, at the depth
SpecEdge's rule calibrates (``envs.split_cost.SplitCostModel.calibrated_depth``: drafting + network
~ the verify pass it overlaps, with the edge users split into two cohorts). Users are taken in
ascending order of the compute share they would need alone in ED, and each joins the ED batch if
the batch stays feasible on the whole server (``envs.split_plan``'s check) -- a user the server
cannot verify in time, or whose edge cannot hold the draft, is left to the others. BALANCE then
serves who it can of the rest, with the compute share and KV memory the ED batch leaves
(``agents.balance_ed.modes_for_rest``). No optimality claim: a baseline.
"""

from __future__ import annotations

import numpy as np

from agents.balance import Balance, split_search
from agents.balance_ed import modes_for_rest, plan_with_ed
from agents.ed_batch import fixed_depth_option, round_ed_users, split_model
from envs.plan import Plan
from envs.split_cost import SplitCostModel
from envs.split_plan import EdUsers
from envs.workload import Round


def calibrated_depths(split: SplitCostModel, rnd: Round, users: EdUsers, max_depth: int) -> np.ndarray:
    """Per user, SpecEdge's calibrated chain depth (0 for users without an edge), at the user's
    mean context ``I + O / 2`` and own RTT, against a verify pass of half the edge users (one cohort)."""
    k = rnd.num_users
    has = users.allowed.any(axis=1)
    cohort = max(1, int(np.ceil(np.count_nonzero(has) / 2)))
    rtt = np.full(k, split.net.rtt_s) if rnd.rtt_s is None else np.asarray(rnd.rtt_s, dtype=float)
    depth = np.zeros(k, dtype=np.int64)
    for u in np.flatnonzero(has):
        context = float(rnd.input_tokens[u]) + float(rnd.output_tokens[u]) / 2.0
        depth[u] = split.calibrated_depth(float(rnd.alpha[u]), context, float(rtt[u]), verify_clients=cohort, max_depth=max_depth)
    return depth


class EdgeFirst(Balance):
    """Edge-capable users to ED at their calibrated depth first; BALANCE for the rest."""

    name = "edge_first"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.split = split_model(self.cost.profile)  # None: the profile has no edge, so no user runs ED

    def decide(self, rnd: Round) -> Plan:
        if self.split is None:
            return split_search(self.cost, rnd, self.gamma, self._z, self._lam)
        users = round_ed_users(self.split, rnd, self.max_gamma)
        depth = calibrated_depths(self.split, rnd, users, self.max_gamma)
        cand = np.flatnonzero(depth > 0)
        cand = cand[users.allowed[cand, depth[cand] - 1]]
        if len(cand) == 0:
            return split_search(self.cost, rnd, self.gamma, self._z, self._lam)
        memory = float(self.cost.memory_budget(False))
        alone = np.array([fixed_depth_option(self.cost, users, rnd, np.array([u]), depth[[u]]).share for u in cand])
        chosen: list[int] = []
        option = fixed_depth_option(self.cost, users, rnd, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
        for u in cand[np.argsort(alone, kind="stable")]:
            trial = np.sort(np.array(chosen + [int(u)]))
            opt = fixed_depth_option(self.cost, users, rnd, trial, depth[trial])
            if opt.share <= 1.0 + 1e-9 and opt.memory_bytes <= memory * (1 + 1e-9):
                chosen, option = list(trial), opt
        ed_idx = np.array(chosen, dtype=np.int64)
        if len(ed_idx) == 0:
            return split_search(self.cost, rnd, self.gamma, self._z, self._lam)
        modes = modes_for_rest(self.cost, rnd, self.gamma, self._z, self._lam, ed_idx, option)
        return plan_with_ed(self.cost, users, rnd, self.gamma, ed_idx, option, modes)
