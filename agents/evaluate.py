"""Evaluate schedulers on the same rounds and compare them.

    python -m agents.evaluate schedulers=[balance,ad_only,sd_only,optimal] env.num_users=12 rounds=20 seed=0 output=out.csv

Writes one row per (scheduler, round) -- ``scheduler, round, num_users, served, admitted_ad,
admitted_sd, gamma, z, lam, decision_s`` (+ ``upper_bound``, ``gap`` for the optimum) -- and prints
and saves a summary: mean served fraction with its 95 % confidence interval, the ratio to BALANCE
and to the optimum where it is known, the **paired** difference to BALANCE on the same rounds
(bootstrap 95 % CI, Wilcoxon signed-rank test), and decision times. Rounds are round ``0..n-1`` of
the ``split`` stream from ``seed`` (``envs.workload``; default ``test``, the reported stream), so
every scheduler sees the same rounds whatever their number.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats
from tqdm import tqdm

from agents.artefacts import check_writable, write_csv_atomic, write_text_atomic
from agents.paired_stats import paired_difference
from agents.registry import UnknownSchedulerError, make_scheduler
from agents.threads import limit_threads
from envs.config import (
    ConfigError,
    EnvConfig,
    refuse_renamed_keys,
    refuse_renamed_overrides,
    resolve_draft_depth,
)
from envs.cost_model import CostModel
from envs.feasibility import check_plan
from envs.outcome import evaluate_plan
from envs.plan import DEFAULT_DRAFT_DEPTH
from envs.workload import Round, Split, make_rounds, round_rng

__all__ = ["evaluate_schedulers", "format_summary", "run", "summarize"]

OPTIMA = ("optimal", "exhaustive")


def _note_policy_observation(name: str, sched, cfg: EnvConfig, largest_round: int) -> None:
    """Warn where a policy will not see the rounds as the caller's env config describes them: its
    look-ahead and user order come from its policy.json, and a round larger than its look-ahead is
    planned with only the next ``max_users`` users in view."""
    seen = getattr(sched, "observation", None)
    if seen is None:
        return
    differ = {k: (v, getattr(cfg, k)) for k, v in seen.items() if getattr(cfg, k) != v and not (k == "max_users" and getattr(cfg, k) is None)}
    if differ:
        text = ", ".join(f"{k}={mine!r} (env: {theirs!r})" for k, (mine, theirs) in differ.items())
        warnings.warn(f"{name}: observes rounds with its own {text}, from its policy.json", stacklevel=3)
    if largest_round > seen["max_users"]:
        warnings.warn(f"{name}: rounds of {largest_round} users exceed its look-ahead of {seen['max_users']}: "
                      f"each decision sees the next {seen['max_users']} users only", stacklevel=3)


def evaluate_schedulers(
    cfg: EnvConfig,
    schedulers: list[str],
    rounds: int | list[Round] = 20,
    seed: int = 0,
    draft_depth: int = DEFAULT_DRAFT_DEPTH,
    progress: bool = False,
    split: Split = "test",
    **options: Any,
) -> pd.DataFrame:
    """One row per (scheduler, round). Every plan is checked with the exact feasibility test.

    ``rounds`` is a list of rounds, or a number of rounds of the ``split`` stream from ``seed``.
    """
    cost = CostModel.from_config(cfg)
    rnds = make_rounds(cfg, rounds, seed, split=split) if isinstance(rounds, int) else list(rounds)
    # every scheduler is built before any runs: an unknown name or a missing policy fails at once
    built = [(name, make_scheduler(name, cost, cfg.max_gamma, draft_depth=draft_depth, seed=seed, **options)) for name in schedulers]
    largest_round = max((r.num_users for r in rnds), default=0)
    for name, sched in built:
        _note_policy_observation(name, sched, cfg, largest_round)
    rows = []
    for name, sched in built:
        for r, rnd in enumerate(tqdm(rnds, desc=f"{name:>12}", disable=not progress, leave=False)):
            plan = sched.plan(rnd)
            if not check_plan(cost, rnd, plan).feasible:
                raise AssertionError(f"scheduler {name!r} returned an infeasible plan on round {r}")
            out = evaluate_plan(cost, rnd, plan, rng=round_rng(seed, r, 1), simulate_acceptance=cfg.simulate_acceptance, completion=cfg.completion, sharing=cfg.sharing)
            rows.append(
                {
                    "scheduler": name,
                    "round": r,
                    "num_users": rnd.num_users,
                    "served": out.served_count,
                    "admitted_ad": plan.admitted_ad,
                    "admitted_sd": plan.admitted_sd,
                    "gamma": plan.gamma,
                    "z": plan.z,
                    "lam": plan.lam,
                    "decision_s": plan.decision_s,
                    "upper_bound": plan.extra.get("upper_bound", np.nan),
                    "gap": plan.extra.get("gap", np.nan),
                }
            )
    return pd.DataFrame(rows)


def _ci95(x: np.ndarray) -> float:
    if len(x) < 2:
        return float("nan")
    return float(stats.t.ppf(0.975, len(x) - 1) * np.std(x, ddof=1) / np.sqrt(len(x)))


def summarize(df: pd.DataFrame, reference: str = "balance") -> pd.DataFrame:
    """Per scheduler: served fraction (mean, 95 % CI), ratios to BALANCE and the optimum, timing.

    With the ``reference`` scheduler present, also the paired comparison on the shared rounds
    (``agents.paired_stats``): ``diff_vs_<reference>`` -- mean per-round difference in served
    fraction (scheduler - reference) -- its bootstrap 95 % CI ``diff_ci95_low/high`` and the
    Wilcoxon signed-rank p-value ``p_wilcoxon``.
    """
    frac = df["served"] / df["num_users"]
    df = df.assign(served_frac=frac)
    ref = df[df.scheduler == reference].set_index("round")["served"] if reference in set(df.scheduler) else None
    ref_frac = df[df.scheduler == reference].set_index("round")["served_frac"] if ref is not None else None
    opt_name = next((n for n in OPTIMA if n in set(df.scheduler)), None)
    opt = df[df.scheduler == opt_name].set_index("round") if opt_name else None
    out = []
    for name, g in df.groupby("scheduler", sort=False):
        g = g.set_index("round")
        row = {
            "scheduler": name,
            "rounds": len(g),
            "served_frac": g.served_frac.mean(),
            "ci95": _ci95(g.served_frac.to_numpy()),
            "served_mean": g.served.mean(),
        }
        if ref is not None:
            row["ratio_to_balance"] = g.served.sum() / max(ref.loc[g.index].sum(), 1)
            # the same rounds for both: the per-round difference, not two overlapping CIs, decides
            if name != reference:
                both = g.index.intersection(ref_frac.index)
                pd_ = paired_difference(g.served_frac.loc[both].to_numpy(), ref_frac.loc[both].to_numpy())
                row.update({f"diff_vs_{reference}": pd_.mean, "diff_ci95_low": pd_.ci_low, "diff_ci95_high": pd_.ci_high, "p_wilcoxon": pd_.p_value})
            else:
                row.update({f"diff_vs_{reference}": np.nan, "diff_ci95_low": np.nan, "diff_ci95_high": np.nan, "p_wilcoxon": np.nan})
        if opt is not None:
            certified = opt.index[opt.gap.fillna(0) == 0].intersection(g.index)
            row["ratio_to_optimum"] = g.served.loc[certified].sum() / max(opt.served.loc[certified].sum(), 1) if len(certified) else np.nan
            row["optimum_certified_rounds"] = len(certified)
            row["ratio_to_upper_bound"] = g.served.sum() / max(opt.upper_bound.loc[g.index].fillna(opt.served.loc[g.index]).sum(), 1)
        row["decision_ms_median"] = 1e3 * g.decision_s.median()
        row["decision_ms_mean"] = 1e3 * g.decision_s.mean()
        out.append(row)
    return pd.DataFrame(out)


def format_summary(summary: pd.DataFrame) -> str:
    return summary.to_markdown(index=False, floatfmt=".4g")


class EvaluateConfigError(ValueError):
    """An evaluation config key out of its range (raised before any scheduler runs)."""


def run(cfg: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The evaluation as the Hydra app runs it, from a plain dict config (bad keys raise
    :class:`EvaluateConfigError` or :class:`envs.config.ConfigError` before any work starts)."""
    cfg = {k: v for k, v in cfg.items() if k != "profile"}  # the app-level profile name; env.profile carries it (interpolated)
    refuse_renamed_keys(cfg, "evaluate")
    known = {"env", "schedulers", "rounds", "seed", "split", "draft_depth", "grid_step", "time_limit_s", "policy_path", "output", "progress", "threads"}
    unknown = sorted(set(cfg) - known)
    if unknown:
        raise EvaluateConfigError(f"unknown evaluate config key(s) {unknown}; known: {sorted(known)}")
    env_raw = dict(cfg["env"])
    env_id = env_raw.pop("id", "EdgeSchedule-v0")  # which environment's rounds and plans (conf/env/split_k20.yaml: v1)
    if env_id not in ("EdgeSchedule-v0", "EdgeSchedule-v1"):
        raise EvaluateConfigError(f"env.id must be 'EdgeSchedule-v0' or 'EdgeSchedule-v1', got {env_id!r}")
    env_cfg = EnvConfig.from_kwargs(**env_raw)
    # one name on the command line (schedulers=balance) arrives as a string, not a one-item list
    names = [cfg["schedulers"]] if isinstance(cfg["schedulers"], str) else list(cfg["schedulers"])
    if not names:
        raise EvaluateConfigError("schedulers must name at least one scheduler")
    if cfg.get("policy_path") and "policy" not in names:  # it would be ignored, silently
        raise EvaluateConfigError(f"policy_path is set but schedulers {names} has no 'policy': add it, e.g. schedulers=[balance,policy]")
    rounds = cfg["rounds"]
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:  # 2.7 is a typo, not 2 rounds
        raise EvaluateConfigError(f"rounds must be an integer >= 1, got {rounds!r}")
    split = cfg.get("split", "test")
    if split not in ("validation", "test"):
        raise EvaluateConfigError(f"split must be 'validation' or 'test' (training rounds are never evaluated on), got {split!r}")
    seed = cfg["seed"]
    if not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise EvaluateConfigError(f"seed must be an integer in [0, 2**32), got {seed!r}")
    output = cfg.get("output")
    if output:
        try:
            check_writable(output, "output")  # before the evaluation, not after it
        except ValueError as err:
            raise EvaluateConfigError(str(err)) from None
    limit_threads(int(cfg.get("threads", 1)))  # before any policy's torch work (agents/threads.py)
    evaluate_fn = evaluate_schedulers
    if env_id == "EdgeSchedule-v1":  # ED plans: the split exact check and outcome (agents/evaluate_v1.py)
        from agents.evaluate_v1 import evaluate_schedulers_v1 as evaluate_fn
    df = evaluate_fn(
        env_cfg,
        names,
        rounds=rounds,
        seed=seed,
        split=split,
        draft_depth=resolve_draft_depth(cfg.get("draft_depth"), env_cfg.max_gamma, "evaluate"),
        progress=bool(cfg.get("progress", True)),
        grid_step=cfg.get("grid_step"),
        time_limit_s=cfg.get("time_limit_s"),
        policy_path=cfg.get("policy_path"),
    )
    summary = summarize(df)
    if output:
        path = Path(output)
        write_csv_atomic(df, path)  # never leave a half-written CSV behind
        write_csv_atomic(summary, path.with_name(path.stem + "_summary.csv"))
        write_text_atomic(path.with_name(path.stem + "_summary.md"), format_summary(summary) + "\n")
    return df, summary


def _main() -> None:
    import sys

    import hydra
    from omegaconf import OmegaConf

    @hydra.main(version_base="1.3", config_path="../conf", config_name="evaluate")
    def app(cfg) -> None:
        plain = OmegaConf.to_container(cfg, resolve=True)
        try:
            df, summary = run(plain)
        except (EvaluateConfigError, ConfigError, UnknownSchedulerError, FileNotFoundError) as err:  # a refusal is one line, as agents.train's, not a traceback
            raise SystemExit(f"agents.evaluate: error: {err}") from None
        print(format_summary(summary))
        if plain.get("output"):
            print(f"wrote {plain['output']} ({len(df)} rows) and its summary")

    refuse_renamed_overrides(sys.argv[1:], "evaluate")
    app()


if __name__ == "__main__":
    _main()
