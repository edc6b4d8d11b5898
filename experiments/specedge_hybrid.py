"""Part 2 of ``experiments.specedge``: the hybrid -- users served per round by BALANCE (AD and SD only)
against BALANCE with ED (``agents.balance_ed``) and ``edge_first``, as the share of users with an edge
GPU grows.

Test rounds (``envs.workload.make_rounds(..., split="test")``, seed :data:`SEED`) of the paper's
workload on :data:`HYBRID_PROFILE`'s server; every plan is re-checked by the exact v1 check
(``envs.split_plan``); paired differences against BALANCE with bootstrap 95 % CIs and Wilcoxon
p-values (``agents.paired_stats``). With realised = predicted (the default workload) admitted = served.
"""

from __future__ import annotations

import time

import numpy as np
import pandas as pd

from agents.balance import Balance
from agents.balance_ed import BalanceED
from agents.edge_first import EdgeFirst
from agents.paired_stats import paired_difference
from envs import CostModel
from envs.config import EnvConfig
from envs.split_cost import SplitCostModel
from envs.split_plan import check_plan_split, ed_users
from envs.workload import make_rounds

SEED = 1000003  #: the test stream's seed (as in experiments.learned and experiments.optimality)
HYBRID_PROFILE = "split_a100-40gb_llama2-7b_tinyllama-1.1b"  #: the chain drafts' profile of experiments.specedge
HYBRID_SCHEDULERS = (Balance, BalanceED, EdgeFirst)


def hybrid_rows(ks: list[int], fractions: list[float], rounds: int, progress: bool = True) -> pd.DataFrame:
    """Part 2: served users per round, scheduler, K and edge fraction (BALANCE once per K: it ignores edges)."""
    rows = []
    total = len(ks) * (1 + (len(HYBRID_SCHEDULERS) - 1) * sum(f > 0 for f in fractions)) * rounds
    done, start = 0, time.perf_counter()
    for k in ks:
        for frac in fractions:
            cfg = EnvConfig(num_users=k, profile=HYBRID_PROFILE, edge_fraction=frac)
            cost = CostModel.from_config(cfg)
            split = SplitCostModel(cost.profile)
            # BALANCE ignores edges and rounds share their users across fractions (common random
            # numbers): it runs once per K, at fraction 0, where the ED schedulers are BALANCE
            schedulers = [Balance] if frac == 0 else [cls for cls in HYBRID_SCHEDULERS if cls is not Balance]
            for r, rnd in enumerate(make_rounds(cfg, rounds, SEED, split="test")):
                users = ed_users(split, rnd, cfg.max_gamma)
                for cls in schedulers:
                    plan = cls(cost, cfg.max_gamma, 4).plan(rnd)
                    depth = plan.ed_depth if plan.ed_depth is not None else np.zeros(k, dtype=np.int64)
                    if not check_plan_split(cost, users, rnd, plan.modes, plan.gamma, depth).feasible:
                        raise RuntimeError(f"{cls.name} returned an infeasible plan (K={k}, edge_fraction={frac}, round {r})")
                    rows.append({"scheduler": cls.name, "num_users": k, "edge_fraction": frac, "round": r, "served": plan.admitted,
                                 "served_ad": plan.admitted_ad, "served_sd": plan.admitted_sd, "served_ed": plan.admitted_ed,
                                 "edge_users": int(np.count_nonzero(rnd.has_edge)) if rnd.has_edge is not None else 0,
                                 "decision_s": plan.decision_s})
                    done += 1
                if progress and (r + 1) % max(1, rounds // 4) == 0:
                    print(f"  hybrid K={k} edge_fraction={frac}: {r + 1}/{rounds} rounds ({done}/{total} plans, {time.perf_counter() - start:.0f} s)", flush=True)
    return pd.DataFrame(rows)


def hybrid_summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per K and edge fraction: mean served by each scheduler and paired differences against BALANCE."""
    out = []
    base = df[df["scheduler"] == "balance"].set_index(["num_users", "round"])["served"]
    for (k, frac), grp in df[df["scheduler"] != "balance"].groupby(["num_users", "edge_fraction"]):
        b = base.loc[k].sort_index()
        row = {"num_users": k, "edge_fraction": frac, "balance_served": float(b.mean())}
        for name, g in grp.groupby("scheduler"):
            a = g.set_index("round")["served"].sort_index()
            diff = paired_difference(a.to_numpy(), b.loc[a.index].to_numpy())
            row[f"{name}_served"] = float(a.mean())
            row.update(diff.as_dict(prefix=f"{name}_minus_balance_"))
            row[f"{name}_ed_share"] = float(g["served_ed"].sum() / max(g["served"].sum(), 1))
        out.append(row)
    return pd.DataFrame(out)
