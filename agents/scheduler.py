"""The one scheduler interface: ``plan(round) -> Plan``.

Every scheduler -- BALANCE, the baselines, the exact optimum, a learned policy -- implements
:meth:`Scheduler.decide`; :meth:`Scheduler.plan` times it and fills ``Plan.decision_s``. The
environment's evaluation, ``agents.evaluate`` and the live runtime use only this interface.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod

import numpy as np

from envs.config import EnvConfig
from envs.cost_model import CostModel
from envs.plan import Plan
from envs.workload import Round


class Scheduler(ABC):
    """Decides a plan for a round of users from their predictions."""

    name: str = "scheduler"

    def __init__(self, cost: CostModel, cfg: EnvConfig, gamma: int = 4, seed: int | None = None):
        if not 1 <= gamma <= cfg.max_gamma:
            raise ValueError(f"gamma must be in [1, max_gamma={cfg.max_gamma}], got {gamma}")
        self.cost = cost
        self.cfg = cfg
        self.gamma = int(gamma)
        self.rng = np.random.default_rng(seed)

    @abstractmethod
    def decide(self, rnd: Round) -> Plan:
        """The plan for ``rnd`` (``decision_s`` is filled in by :meth:`plan`)."""

    def plan(self, rnd: Round) -> Plan:
        start = time.perf_counter()
        plan = self.decide(rnd)
        plan.decision_s = time.perf_counter() - start
        return plan
