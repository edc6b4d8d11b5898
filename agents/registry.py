"""Scheduler names -> classes, so configs and command lines can name any scheduler."""

from __future__ import annotations

from typing import Any

from agents.balance import Balance, BalanceGammaSearch
from agents.balance_ed import BalanceED
from agents.baselines import ECRA, ECRMA, EMA, ADOnly, Greedy, RandomScheduler, SDOnly
from agents.edge_first import EdgeFirst
from agents.optimal import Exhaustive, Optimal
from agents.optimal_v1 import OptimalV1
from agents.scheduler import Scheduler
from envs.cost_model import CostModel
from envs.plan import DEFAULT_DRAFT_DEPTH

SCHEDULERS: dict[str, type[Scheduler]] = {
    cls.name: cls
    for cls in (Balance, BalanceGammaSearch, ADOnly, SDOnly, ECRA, EMA, ECRMA, Greedy, RandomScheduler, Exhaustive, Optimal,
                # with the ED mode (SpecEdge split; AD/SD only on a profile without an edge section)
                BalanceED, EdgeFirst, OptimalV1)
}
#: options each scheduler accepts from the evaluation config (others are ignored for it)
OPTIONS = {
    "grid_step": (Balance,),
    "time_limit_s": (Exhaustive, Optimal),
    "warm_start": (Exhaustive,),
}


class UnknownSchedulerError(ValueError):
    """A scheduler name that is neither in ``SCHEDULERS`` nor ``policy``."""


def make_scheduler(name: str, cost: CostModel, max_gamma: int, draft_depth: int = DEFAULT_DRAFT_DEPTH, seed: int | None = None, **options: Any) -> Scheduler:
    """Build a scheduler by name; ``policy`` needs ``policy_path`` (a trained model).

    ``max_gamma`` is the largest draft depth a plan may use, ``draft_depth`` the fixed depth of the
    schedulers that use one (see :class:`agents.scheduler.Scheduler`).
    """
    if name == "policy":
        from agents.policy import PolicyScheduler  # torch is only imported when a policy is used

        path = options.get("policy_path")
        if not path:
            raise ValueError("scheduler 'policy' needs policy_path=PATH/model.zip")
        return PolicyScheduler(cost, max_gamma, draft_depth=draft_depth, seed=seed, path=path)
    if name not in SCHEDULERS:
        raise UnknownSchedulerError(f"unknown scheduler {name!r}; known: {sorted(SCHEDULERS) + ['policy']}")
    cls = SCHEDULERS[name]
    kwargs = {k: v for k, v in options.items() if v is not None and k in OPTIONS and issubclass(cls, OPTIONS[k])}
    return cls(cost, max_gamma, draft_depth=draft_depth, seed=seed, **kwargs)
