"""How far BALANCE is from the optimum, K = 20 ... 200, on test rounds.

    python -m experiments.optimality                       # the published run (see --help for sizes)
    python -m experiments.optimality --ks 20,50 --rounds 3,3 --time-limits 5,5 --out /tmp/opt

For each K: ``--rounds`` rounds of the **test** stream (``envs.workload.make_rounds(..., split="test")``,
seed 1000003, the stream ``experiments.learned`` uses) in the paper setting; BALANCE plans each
round, then ``optimal`` (``agents.optimal``, warm-started from BALANCE) gets ``--time-limits``
seconds. Both use draft depth 4: the bound is the optimum over plans with that depth, so it does
not bound schedulers that pick the depth per round (learned policies do). Per round: the best plan found, the proven upper bound, whether it is certified (gap 0)
and the solver's time. BALANCE's served users as a share of the optimum is exact where
certified and otherwise a proven *lower* bound on the share (``served / upper_bound``).

Writes ``<out>.csv`` (one row per round), ``<out>.md`` (per-K summary) and ``<out>.png``, and
``<out>_traces.json`` (each round's anytime trace: best plan and bound over time).

``--policies`` (default: the shipped ``policies/paper_k50``, ``policies/noisy_k50`` and the any-K set
policy ``policies/general``) at the Ks
of ``--policy-ks`` (default 200): each learned policy plans the round too, its plan warm-starts
``optimal``, and its served users are reported over the same proven bound. The bound is over plans
with draft depth 4; a policy that picks another depth is bounded by it only where its plan has no
SD user, so ``<policy>_bounded`` gives the share of rounds where the comparison is proven.
"""

from __future__ import annotations

import argparse
import io
import json
import time
from pathlib import Path

import numpy as np
import pandas as pd

from agents.artefacts import (
    require_writable,
    write_bytes_atomic,
    write_csv_atomic,
    write_text_atomic,
)
from agents.balance import Balance
from agents.optimal import Optimal
from envs.config import EnvConfig
from envs.cost_model import CostModel
from envs.feasibility import check_plan
from envs.plan import SD
from envs.workload import make_rounds

ROOT = Path(__file__).resolve().parent.parent
SEED = 1000003  #: the test stream's seed (as in experiments.learned)


def _ints(text: str, name: str) -> list[int]:
    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SystemExit(f"--{name} must be comma-separated integers, got {text!r}") from None
    if not vals or min(vals) < 1:
        raise SystemExit(f"--{name} must hold integers >= 1, got {text!r}")
    return vals


def _floats(text: str, name: str) -> list[float]:
    try:
        vals = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SystemExit(f"--{name} must be comma-separated numbers, got {text!r}") from None
    if not vals or min(vals) <= 0:
        raise SystemExit(f"--{name} must hold numbers > 0, got {text!r}")
    return vals


def _policies(paths: list[Path], cost: CostModel, max_gamma: int) -> list[tuple[str, object]]:
    """(label, scheduler) for each learned policy folder (label: the folder's name)."""
    from agents.policy import PolicyScheduler  # torch only when policies are asked for

    return [(p.name, PolicyScheduler(cost, max_gamma, path=str(p))) for p in paths]


def run(ks: list[int], rounds: list[int], limits: list[float], bound_steps: list[float], progress: bool = True, policies: list[Path] = (), policy_ks: tuple[int, ...] = ()) -> tuple[pd.DataFrame, dict]:
    """One row per (K, round); traces keyed ``"K/round"``."""
    rows, traces = [], {}
    for k, n, limit, step in zip(ks, rounds, limits, bound_steps, strict=True):
        cfg = EnvConfig(num_users=k)
        cost = CostModel.from_config(cfg)
        bal = Balance(cost, cfg.max_gamma)
        opt = Optimal(cost, cfg.max_gamma, time_limit_s=limit, bound_step=step)
        pols = _policies(list(policies), cost, cfg.max_gamma) if k in policy_ks else []
        for r, rnd in enumerate(make_rounds(cfg, n, SEED, split="test")):
            b_plan = bal.plan(rnd)
            row = {"K": k, "round": r, "balance": b_plan.admitted, "balance_s": b_plan.decision_s}
            warm = []
            for label, sched in pols:
                p_plan = sched.plan(rnd)
                if not check_plan(cost, rnd, p_plan).feasible:
                    raise AssertionError(f"policy {label} returned an infeasible plan at K={k}, round {r}")
                row[label] = p_plan.admitted
                # the bound (draft depth 4) covers the policy's plan if it runs at 4 or has no SD user
                row[f"{label}_bounded"] = bool(p_plan.gamma == opt.gamma or not (p_plan.modes == SD).any())
                warm.append(p_plan)
            start = time.perf_counter()
            o_plan = opt.solve(rnd, warm=warm)
            solver_s = time.perf_counter() - start
            if not check_plan(cost, rnd, o_plan).feasible:
                raise AssertionError(f"optimal returned an infeasible plan at K={k}, round {r}")
            ex = o_plan.extra
            trace = ex["trace"]
            row.update(
                {
                    "best": o_plan.admitted,
                    "upper_bound": ex["upper_bound"],
                    "certified": ex["certified"],
                    "gap_pct": 100.0 * (ex["upper_bound"] - o_plan.admitted) / max(ex["upper_bound"], 1),
                    "solver_s": solver_s,
                    "final_bound_at_s": trace[-1]["t_s"],
                    "time_limit_s": limit,
                }
            )
            rows.append(row)
            traces[f"{k}/{r}"] = trace
            if progress:
                print(f"K={k} round {r}: balance {row['balance']}, best {row['best']}, bound {row['upper_bound']}, certified {row['certified']}, {solver_s:.1f} s", flush=True)
    return pd.DataFrame(rows), traces


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """Per K: certified share, gaps, solver time, and each scheduler's share of the optimum."""
    out = []
    for k, g in df.groupby("K"):
        row = {
            "K": k,
            "rounds": len(g),
            "time_limit_s": g["time_limit_s"].iloc[0],
            "certified": g["certified"].mean(),
            "gap_le_1pct": (g["gap_pct"] <= 1.0).mean(),
            "gap_pct_median": g["gap_pct"].median(),
            "gap_pct_max": g["gap_pct"].max(),
            "solver_s_median": g["solver_s"].median(),
            "bound_final_s_median": g["final_bound_at_s"].median(),
            # served / bound <= served / OPT: a proven lower bound on the share (exact where certified)
            "balance_of_opt_at_least": g["balance"].sum() / g["upper_bound"].sum(),
            "balance_of_best": g["balance"].sum() / g["best"].sum(),
            "rounds_best_beats_balance": (g["best"] > g["balance"]).mean(),
        }
        for col in [c for c in df.columns if c.endswith("_bounded")]:
            label = col[: -len("_bounded")]
            if g[label].notna().any():
                row[f"{label}_of_bound"] = g[label].sum() / g["upper_bound"].sum()
                row[f"{label}_of_best"] = g[label].sum() / g["best"].sum()
                row[col] = g[col].astype(float).mean()
        out.append(row)
    return pd.DataFrame(out)


def _figure(summary: pd.DataFrame) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    x = np.arange(len(summary))
    a.bar(x - 0.2, summary["balance_of_opt_at_least"], 0.4, label="BALANCE / bound")
    a.bar(x + 0.2, summary["balance_of_best"], 0.4, label="BALANCE / best found")
    a.set_ylim(0.8, 1.0)
    a.set_xticks(x, [str(k) for k in summary["K"]])
    a.set_xlabel("users K")
    a.set_ylabel("served / proven upper bound")
    a.legend(loc="lower left")
    b.bar(x - 0.2, summary["certified"], 0.4, label="certified optimal")
    b.bar(x + 0.2, summary["gap_le_1pct"], 0.4, label="gap <= 1 %")
    b.set_xticks(x, [str(k) for k in summary["K"]])
    b.set_xlabel("users K")
    b.set_ylabel("share of rounds")
    b.set_ylim(0, 1.05)
    b.legend(loc="lower left")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    return buf.getvalue()


def _markdown(df: pd.DataFrame, summary: pd.DataFrame, command: str) -> str:
    labels = [c[: -len("_bounded")] for c in summary.columns if c.endswith("_bounded")]
    pol_cols = [f"{lab}{suffix}" for lab in labels for suffix in ("_of_bound", "_of_best", "_bounded")]
    main_cols = [c for c in summary.columns if c not in pol_cols]
    lines = [
        "# BALANCE against the certified optimum",
        "",
        f"Test rounds (seed {SEED}), paper setting, `optimal` per round under the time limit. "
        "`certified`: share of rounds solved to proven optimality; `gap_pct`: 100 (bound - best) / bound; "
        "`balance_of_opt_at_least`: BALANCE's served users over the proven bounds (a lower bound on its "
        "share of the optimum, exact where certified); `balance_of_best`: over the best plans found. "
        "The proven bound is the least of the split bound, the joint bound (`agents.joint_bound`: both batches' KV "
        "memory charged together, so no user counts twice; each batch confined to one relaxed output row, "
        "`row_levels` = 16 per input bucket) and the exhaustive search's target descent.",
        "",
        summary[main_cols].to_markdown(index=False, floatfmt=".4g"),
        "",
    ]
    if pol_cols:
        lines += [
            "Learned policies (the `policies/` folders named by the column prefixes, e.g. the K = 50 policies `paper_k50`, "
            "`noisy_k50` and the any-K set policy `general`, planning the same rounds; their plans also warm-start "
            "`optimal`): served over the proven bounds (`_of_bound`, a lower bound on the share of the optimum) and "
            "over the best plans found (`_of_best`); the bound is over draft depth 4, so it covers a policy's plan only "
            "where it runs at depth 4 or serves nobody in SD (`_bounded`: share of such rounds).",
            "",
            summary[["K", *pol_cols]].dropna(subset=pol_cols[:1]).to_markdown(index=False, floatfmt=".4g"),
            "",
        ]
    lines += [
        f"Reproduce: `{command}` (2 shared CPU cores).",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ks", default="20,50,70,100,200")
    ap.add_argument("--rounds", default="20,20,20,20,20", help="rounds per K")
    ap.add_argument("--time-limits", default="60,60,60,45,60", help="seconds per round, per K")
    ap.add_argument("--bound-steps", default="0.02,0.02,0.02,0.05,0.05", help="split-bound grid step per K (coarser is faster)")
    ap.add_argument("--policies", default="policies/paper_k50,policies/noisy_k50,policies/general", help="learned policy folders (relative to the repo); missing ones are skipped, '' for none")
    ap.add_argument("--policy-ks", default="200", help="Ks at which the policies plan and warm-start the optimum")
    ap.add_argument("--out", default=str(ROOT / "results" / "optimality"), help="output path without extension")
    args = ap.parse_args(argv)
    ks, rounds = _ints(args.ks, "ks"), _ints(args.rounds, "rounds")
    limits, steps = _floats(args.time_limits, "time-limits"), _floats(args.bound_steps, "bound-steps")
    if not len(ks) == len(rounds) == len(limits) == len(steps):
        raise SystemExit("--ks, --rounds, --time-limits and --bound-steps must have the same length")
    if max(steps) > 1:
        raise SystemExit(f"--bound-steps must be in (0, 1], got {args.bound_steps!r}")
    if not all(0 < t < float("inf") for t in limits):  # NaN fails the comparison too
        raise SystemExit(f"--time-limits must be finite numbers > 0, got {args.time_limits!r}")
    require_writable(Path(args.out).with_suffix(".csv"), "--out")
    policies = [ROOT / p.strip() for p in args.policies.split(",") if p.strip()]
    policies = [p for p in policies if (p / "model.zip").is_file()]
    policy_ks = tuple(_ints(args.policy_ks, "policy-ks")) if policies else ()
    df, traces = run(ks, rounds, limits, steps, policies=policies, policy_ks=policy_ks)
    summary = summarize(df)
    out = Path(args.out)
    command = "python -m experiments.optimality " + " ".join(argv if argv is not None else __import__("sys").argv[1:])
    write_csv_atomic(df, out.with_suffix(".csv"))
    write_text_atomic(out.with_suffix(".md"), _markdown(df, summary, command.strip()))
    write_text_atomic(out.parent / f"{out.name}_traces.json", json.dumps(traces))
    write_bytes_atomic(out.with_suffix(".png"), _figure(summary))
    print(summary.to_markdown(index=False, floatfmt=".4g"))


if __name__ == "__main__":
    main()
