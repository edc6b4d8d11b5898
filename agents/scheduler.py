"""The one scheduler interface: ``plan(round) -> Plan``.

Every scheduler -- BALANCE, the baselines, the exact optimum, a learned policy -- implements
:meth:`Scheduler.decide`; :meth:`Scheduler.plan` times it and fills ``Plan.decision_s``. The
environment's evaluation, ``agents.evaluate`` and the live runtime use only this interface.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod

import numpy as np

from envs.cost_model import CostModel
from envs.plan import DEFAULT_DRAFT_DEPTH, Plan
from envs.workload import Round


class Scheduler(ABC):
    """Decides a plan for a round of users from their predictions."""

    name: str = "scheduler"
    #: the largest round (users) the scheduler can decide; None: any. Exhaustive searches set it, so
    #: that a server can refuse a round size it would fail on before it starts (runtime.serve_config)
    max_users: int | None = None

    def __init__(self, cost: CostModel, max_gamma: int, draft_depth: int = DEFAULT_DRAFT_DEPTH, seed: int | None = None):
        """``cost`` prices plans; ``max_gamma`` is the largest draft depth a plan may use (tokens);
        ``draft_depth`` the depth of the schedulers that use one fixed depth (``Plan.gamma``);
        ``seed`` seeds :attr:`rng` (randomised schedulers only)."""
        if isinstance(max_gamma, bool) or not isinstance(max_gamma, (int, np.integer)) or max_gamma < 1:
            raise ValueError(f"max_gamma must be an integer >= 1, got {max_gamma!r}")
        if isinstance(draft_depth, bool) or not isinstance(draft_depth, (int, np.integer)) or not 1 <= draft_depth <= max_gamma:
            raise ValueError(f"draft_depth must be an integer in [1, max_gamma={max_gamma}], got {draft_depth!r}")
        self.cost = cost
        self.max_gamma = int(max_gamma)
        self.gamma = int(draft_depth)  #: the fixed draft depth (``Plan.gamma``), tokens per SD iteration
        self.rng = np.random.default_rng(seed)

    @abstractmethod
    def decide(self, rnd: Round) -> Plan:
        """The plan for ``rnd`` (``decision_s`` is filled in by :meth:`plan`)."""

    def plan(self, rnd: Round) -> Plan:
        start = time.perf_counter()
        plan = self.decide(rnd)
        plan.decision_s = time.perf_counter() - start
        return plan
