"""Schedulers on EdgeSchedule-v1 rounds (AD, SD and ED users): evaluation.

:func:`evaluate_schedulers_v1` is ``agents.evaluate.evaluate_schedulers`` for plans that may hold ED
users: every plan is checked with the split exact check (``envs.split_plan.check_plan_split``) and
scored with ``envs.split_outcome.evaluate_split_plan`` (which *is* v0's outcome for plans without ED
users), with the same outcome generator per round (``round_rng(seed, r, 1)``). Rows add
``admitted_ed``; ``agents.evaluate.summarize`` reads them as it reads v0's.
Training-time validation on v1 is ``agents.train_callbacks.ValidationEvaluationV1`` (against
:data:`REFERENCE_V1`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from tqdm import tqdm

from agents.registry import make_scheduler
from envs.config import EnvConfig
from envs.cost_model import CostModel
from envs.plan import DEFAULT_DRAFT_DEPTH, ED
from envs.split_cost import SplitCostModel
from envs.split_outcome import evaluate_split_plan
from envs.split_plan import check_plan_split, ed_users
from envs.workload import Round, Split, make_rounds, round_rng

#: the reference of the validation (model.zip) and of the paired differences
REFERENCE_V1 = "balance_ed"


def _scheduler(name: str, cost: CostModel, cfg: EnvConfig, draft_depth: int, seed: int, policy_path: str | None, **options: Any):
    if name == "policy":
        from agents.policy_v1 import PolicyV1Scheduler

        if not policy_path:
            raise ValueError("scheduler 'policy' needs policy_path=PATH (a policy folder trained on EdgeSchedule-v1)")
        return PolicyV1Scheduler(cost, cfg.max_gamma, draft_depth=draft_depth, seed=seed, path=policy_path)
    return make_scheduler(name, cost, cfg.max_gamma, draft_depth=draft_depth, seed=seed, **options)


def evaluate_schedulers_v1(cfg: EnvConfig, schedulers: list[str], rounds: int | list[Round] = 20, seed: int = 0, draft_depth: int = DEFAULT_DRAFT_DEPTH,
                           progress: bool = False, split: Split = "test", policy_path: str | None = None, **options: Any) -> pd.DataFrame:
    """One row per (scheduler, round) on v1 rounds; ``rounds`` a list or a number of ``split`` rounds from ``seed``."""
    cost = CostModel.from_config(cfg)
    has_split = cost.profile.edge is not None and cost.profile.network is not None
    split_model = SplitCostModel(cost.profile) if has_split else None
    rnds = make_rounds(cfg, rounds, seed, split=split) if isinstance(rounds, int) else list(rounds)
    users = [ed_users(split_model, rnd, cfg.max_gamma) if split_model is not None else None for rnd in rnds]
    built = [(name, _scheduler(name, cost, cfg, draft_depth, seed, policy_path, **options)) for name in schedulers]  # all before any runs
    rows = []
    for name, sched in built:
        for r, rnd in enumerate(tqdm(rnds, desc=f"{name:>12}", disable=not progress, leave=False)):
            plan = sched.plan(rnd)
            depth = plan.ed_depth if plan.ed_depth is not None else np.zeros(rnd.num_users, dtype=np.int64)
            if np.any(plan.modes == ED) and users[r] is None:
                raise AssertionError(f"scheduler {name!r} put users in ED on round {r} of a profile without an edge section")
            if users[r] is not None and not check_plan_split(cost, users[r], rnd, plan.modes, plan.gamma, depth).feasible:
                raise AssertionError(f"scheduler {name!r} returned an infeasible plan on round {r}")
            out = evaluate_split_plan(cost, split_model, rnd, plan, rng=round_rng(seed, r, 1), simulate_acceptance=cfg.simulate_acceptance,
                                      completion=cfg.completion, sharing=cfg.sharing, users=users[r], ed_completion=cfg.completion)
            rows.append({"scheduler": name, "round": r, "num_users": rnd.num_users, "served": out.served_count, "admitted_ad": plan.admitted_ad,
                         "admitted_sd": plan.admitted_sd, "admitted_ed": plan.admitted_ed, "gamma": plan.gamma, "z": plan.z, "ed_share": plan.ed_share,
                         "lam": plan.lam, "decision_s": plan.decision_s})
    return pd.DataFrame(rows)
