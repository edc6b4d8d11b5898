"""Learned schedulers against BALANCE: the comparison table behind issue #4's targets.

    python -m experiments.learned [--rounds 500] [--policy policies/paper_k50] [--noisy-policy policies/noisy_k50]

Writes ``results/learned.md`` and ``results/learned_*.csv``:

1. paper setting (K = 50): policy vs BALANCE, AD-only, SD-only, greedy on ``--rounds`` held-out
   rounds, and vs the optimum (certified where the branch and bound closes) on the first
   ``--opt-rounds`` of them;
2. noisy predictions (CV 0.3 on acceptance and output length): the noisy-trained policy (and the
   paper policy) vs BALANCE;
3. generalisation: the K = 50 policy on rounds of other sizes;
4. decision time per round, policy vs BALANCE, at K = 50, 200, 1000.

Held-out rounds come from seed 1000003 (the training's evaluation seed), never trained on.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd

from agents.evaluate import evaluate_schedulers, make_rounds, summarize
from agents.policy import resolve_policy_path
from envs.config import EnvConfig

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"
SEED = 1000003
COLS = ["scheduler", "rounds", "served_frac", "ci95", "ratio_to_balance", "decision_ms_median"]


def _env(policy: Path, **overrides) -> EnvConfig:
    _, meta = resolve_policy_path(policy)
    return EnvConfig.from_kwargs(**{**meta["env"], **overrides})


def _cmp(cfg: EnvConfig, names: list[str], rounds: int, policy: Path, **kw) -> tuple[pd.DataFrame, pd.DataFrame]:
    df = evaluate_schedulers(cfg, names, rounds=make_rounds(cfg, rounds, SEED), seed=SEED, progress=True, policy_path=str(policy), **kw)
    return df, summarize(df)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy", type=Path, default=ROOT / "policies" / "paper_k50")
    ap.add_argument("--noisy-policy", type=Path, default=ROOT / "policies" / "noisy_k50")
    ap.add_argument("--rounds", type=int, default=500)
    ap.add_argument("--opt-rounds", type=int, default=30)
    ap.add_argument("--gen-rounds", type=int, default=100)
    ap.add_argument("--balance-max-k", type=int, default=200, help="largest K BALANCE is timed at (K = 1000 takes minutes and GBs)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    md = ["# Learned schedulers vs BALANCE", ""]

    cfg = _env(args.policy, num_users=50, alpha_cv=0.0, output_cv=0.0)
    df, s = _cmp(cfg, ["policy", "balance", "ad_only", "sd_only", "greedy"], args.rounds, args.policy)
    df.to_csv(args.out / "learned_paper.csv", index=False)
    md += [f"## Paper setting, K = 50, {args.rounds} held-out rounds (`{args.policy.relative_to(ROOT)}`)", "", s[COLS].to_markdown(index=False, floatfmt=".4g"), ""]

    df, s = _cmp(cfg, ["policy", "balance", "optimal"], args.opt_rounds, args.policy, time_limit_s=10.0)
    df.to_csv(args.out / "learned_optimum.csv", index=False)
    cols = ["scheduler", "rounds", "served_frac", "ratio_to_balance", "ratio_to_optimum", "optimum_certified_rounds", "ratio_to_upper_bound"]
    md += [f"Against the optimum on the first {args.opt_rounds} of those rounds (branch and bound, 10 s a round; `ratio_to_optimum` over the rounds where it is certified):", "", s[cols].to_markdown(index=False, floatfmt=".4g"), ""]

    noisy = cfg.replace(alpha_cv=0.3, output_cv=0.3)
    names = ["balance", "sd_only", "greedy"]
    rows = []
    for label, pol in (("noisy-trained policy", args.noisy_policy), ("paper policy", args.policy)):
        if not (pol / "model.zip").exists():
            md += [f"({label}: {pol} not found, skipped)", ""]
            continue
        df, s = _cmp(noisy, ["policy", *names] if not rows else ["policy"], args.rounds, pol)
        s.loc[s.scheduler == "policy", "scheduler"] = label
        rows.append(s)
        df.to_csv(args.out / f"learned_noisy_{pol.name}.csv", index=False)
    if rows:
        s = pd.concat(rows, ignore_index=True)
        bal = s.loc[s.scheduler == "balance", "served_frac"].iloc[0]
        s["ratio_to_balance"] = s.served_frac / bal
        md += [f"## Noisy predictions (CV 0.3 on acceptance and output), K = 50, {args.rounds} rounds", "", s[COLS].to_markdown(index=False, floatfmt=".4g"), ""]

    gen = []
    for k in (20, 30, 70, 100):
        df, s = _cmp(cfg.replace(num_users=k), ["policy", "balance"], args.gen_rounds, args.policy)
        gen.append(s.assign(K=k))
    g = pd.concat(gen, ignore_index=True)
    g.to_csv(args.out / "learned_generalisation.csv", index=False)
    md += [f"## Generalisation: the K = 50 policy on other round sizes ({args.gen_rounds} rounds each)", "", g[["K", *COLS]].to_markdown(index=False, floatfmt=".4g"), ""]

    timing = []
    for k, n in ((50, 10), (200, 3), (1000, 1)):
        names = ["policy", "balance"] if k <= args.balance_max_k else ["policy"]
        df, s = _cmp(cfg.replace(num_users=k), names, n, args.policy)
        timing.append(s.assign(K=k))
    t = pd.concat(timing, ignore_index=True)
    t.to_csv(args.out / "learned_timing.csv", index=False)
    md += ["## Decision time per round", "", t[["K", "scheduler", "rounds", "served_frac", "decision_ms_median"]].to_markdown(index=False, floatfmt=".4g"), ""]
    md += [f"Reproduce: `python -m experiments.learned --rounds {args.rounds}` ({time.perf_counter() - start:.0f} s here).", ""]
    (args.out / "learned.md").write_text("\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    main()
