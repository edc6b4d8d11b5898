"""Baselines for BALANCE (balance.md §3.7), all through the same per-mode solver where it applies.

That solver is exact, so ``ad_only`` and ``sd_only`` are the single-mode optima (the most users
AD alone, resp. SD alone, can serve), and ``ecra`` / ``ema`` / ``ecrma`` take a best AD set and
then a best SD set among the rest at each of their split points (``tests/test_mode_solver.py``
holds all of them to brute force).

| name | rule |
|---|---|
| ad_only | ``z = lam = 1``: AD alone, the SLM not loaded |
| sd_only | ``z = lam = 0``: SD alone |
| ecra | equal compute: ``z = 0.5``, ``lam`` searched on the grid |
| ema | equal memory: ``lam = 0.5``, ``z`` searched |
| ecrma | both halves: ``z = lam = 0.5`` |
| greedy | users by slack (deadline minus downlink), loosest first; each goes to the feasible mode that adds the least compute share (exact incremental check), else rejected |
| random | users in random order; each to a uniformly random feasible mode (AD or SD), else rejected |
"""

from __future__ import annotations

import numpy as np

from agents.balance import Balance
from agents.scheduler import Scheduler
from envs.plan import AD, SD, Plan
from envs.plan_builder import PlanBuilder
from envs.workload import Round


class ADOnly(Balance):
    name = "ad_only"
    z_grid = [1.0]
    lam_grid = [1.0]


class SDOnly(Balance):
    name = "sd_only"
    z_grid = [0.0]
    lam_grid = [0.0]


class ECRA(Balance):
    name = "ecra"
    z_grid = [0.5]


class EMA(Balance):
    name = "ema"
    lam_grid = [0.5]


class ECRMA(Balance):
    name = "ecrma"
    z_grid = [0.5]
    lam_grid = [0.5]


class _Sequential(Scheduler):
    """Admits users one at a time through the incremental exact check."""

    def _order(self, rnd: Round) -> np.ndarray:  # pragma: no cover - interface
        raise NotImplementedError

    def _choose(self, masks: np.ndarray, builder: PlanBuilder) -> int:  # pragma: no cover
        raise NotImplementedError

    def decide(self, rnd: Round) -> Plan:
        b = PlanBuilder(self.cost, 1, self.max_gamma)
        modes = np.zeros(rnd.num_users, dtype=np.int8)
        sd_col = 1 + self.gamma  # only the scheduler's depth is used
        for k in self._order(rnd):
            masks = b.prepare(*(x[k : k + 1] for x in (rnd.input_tokens, rnd.output_tokens, rnd.alpha, rnd.uplink_s, rnd.slack_s)))[0]
            allowed = {AD: bool(masks[1]), SD: bool(masks[sd_col])}
            mode = self._choose(allowed, b)
            action = 0 if mode == 0 else (1 if mode == AD else sd_col)
            b.apply(np.array([action]))
            modes[k] = mode
        z, lam = b.shares()
        return Plan(modes, gamma=self.gamma, z=float(z[0]), lam=float(lam[0]))


class Greedy(_Sequential):
    name = "greedy"

    def _order(self, rnd: Round) -> np.ndarray:
        # loosest deadlines first: an early tight user would shrink every later user's budget
        return np.argsort(-rnd.slack_s, kind="stable")

    def _choose(self, allowed: dict, builder: PlanBuilder) -> int:
        share_ad, share_sd = builder.candidate_shares()
        added = {}
        if allowed[AD]:
            added[AD] = float(share_ad[0] - builder.share[0, 0])
        if allowed[SD]:
            added[SD] = float(share_sd[0, self.gamma - 1] - builder.share[1, 0])
        return min(added, key=added.get) if added else 0


class RandomScheduler(_Sequential):
    name = "random"

    def _order(self, rnd: Round) -> np.ndarray:
        return self.rng.permutation(rnd.num_users)

    def _choose(self, allowed: dict, builder: PlanBuilder) -> int:
        options = [m for m, ok in allowed.items() if ok]
        return int(self.rng.choice(options)) if options else 0
