"""Learned schedulers against BALANCE, over several training seeds, on the test round stream.

    python -m experiments.learned --runs multirun/paper_k50 --noisy-runs multirun/noisy_k50   # already trained
    python -m experiments.learned --train-seeds 0,1,2,3,4                                     # train, then compare
    python -m experiments.learned                                 # the shipped single policies (one seed)

``--runs`` / ``--noisy-runs`` name a Hydra multirun folder (one ``agents.train`` run per seed, e.g.
``python -m agents.train -m experiment=paper_k50 seed=0,1,2,3,4 hydra.sweep.dir=DIR``) or one
policy folder. ``--train-seeds`` first trains ``experiment=paper_k50`` and ``experiment=noisy_k50``
for those seeds into ``--train-dir`` (``--train-timesteps`` shortens them for a smoke test).

Writes ``results/learned.md`` and ``results/learned_*.csv``:

1. paper setting (K = 50): every seed's policy vs BALANCE, AD-only, SD-only, greedy on ``--rounds``
   test rounds -- per-seed rows with the paired per-round difference to BALANCE (bootstrap 95 % CI,
   Wilcoxon signed-rank), and the across-seed mean with its Student-t 95 % CI; and vs the optimum
   (certified where the branch and bound closes) on the first ``--opt-rounds`` of them;
2. noisy predictions (CV 0.3 on acceptance and output length): noisy-trained and paper policies;
3. generalisation: the K = 50 policies on rounds of other sizes;
4. decision time per round, policy (first seed) vs BALANCE, at K = 50, 200, 1000.

Rounds are the **test** stream of seed 1000003 (``envs.workload``): policies trained on the train
stream and had ``model.zip`` chosen on the validation stream, so none of these rounds was seen.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from agents.artefacts import require_writable, write_csv_atomic, write_text_atomic
from agents.evaluate import evaluate_schedulers, summarize
from agents.paired_stats import t_interval
from agents.policy import resolve_policy_path
from agents.threads import limit_threads
from envs.config import EnvConfig
from envs.workload import make_rounds
from experiments.aggregate import find_runs, run_seed

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"
SEED = 1000003  #: the test stream's seed (the training's eval.seed; validation uses a disjoint stream of it)
PAIRED = ["diff_vs_balance", "diff_ci95_low", "diff_ci95_high", "p_wilcoxon"]
COLS = ["scheduler", "rounds", "served_frac", "ci95", "ratio_to_balance", *PAIRED, "decision_ms_median"]


def _env(policy: Path, **overrides) -> EnvConfig:
    _, meta = resolve_policy_path(policy)
    return EnvConfig.from_kwargs(**{**meta["env"], **overrides})


def _label(prefix: str, run: Path) -> str:
    return f"{prefix} s{run_seed(run)}"


def compare(cfg: EnvConfig, baselines: list[str], runs: list[tuple[str, Path]], rounds: int, **kw) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Baselines once and every (label, run) policy on the same ``rounds`` test rounds; rows and summary."""
    rnds = make_rounds(cfg, rounds, SEED, split="test")
    parts = [evaluate_schedulers(cfg, baselines, rounds=rnds, seed=SEED, progress=True, **kw)] if baselines else []
    for label, run in runs:
        df = evaluate_schedulers(cfg, ["policy"], rounds=rnds, seed=SEED, progress=True, policy_path=str(run), **kw)
        parts.append(df.assign(scheduler=label))
    df = pd.concat(parts, ignore_index=True)
    return df, summarize(df)


def _against(df: pd.DataFrame, reference: str, prefix: str) -> pd.DataFrame:
    """Per-seed paired difference of the policies labelled ``prefix s<seed>`` to ``reference``, and the seeds' mean."""
    s = summarize(df, reference=reference)
    g = s[s.scheduler.str.startswith(prefix + " s")]
    col = f"diff_vs_{reference}"
    out = g[["scheduler", "served_frac", col, "diff_ci95_low", "diff_ci95_high", "p_wilcoxon"]].copy()
    m = t_interval(g[col].to_numpy())
    mean_row = {"scheduler": f"{prefix} (mean of {len(g)} seeds)", "served_frac": g.served_frac.mean(), col: m[0], "diff_ci95_low": m[0] - m[1], "diff_ci95_high": m[0] + m[1], "p_wilcoxon": float("nan")}
    return pd.concat([out, pd.DataFrame([mean_row])], ignore_index=True)


def _gammas(df: pd.DataFrame) -> str:
    """The most common draft depth each scheduler ran at (share of rounds)."""
    parts = []
    for name, g in df.groupby("scheduler", sort=False):
        top = g.gamma.value_counts(normalize=True)
        parts.append(f"{name} {int(top.index[0])} ({top.iloc[0]:.0%})")
    return ", ".join(parts)


def seed_mean(summary: pd.DataFrame, prefix: str) -> dict:
    """Across-seed mean and Student-t 95 % CI half-width of the policies whose label starts with ``prefix``."""
    g = summary[summary.scheduler.str.startswith(prefix + " s")]
    rec: dict = {"policy": prefix, "seeds": len(g)}
    for col in ("served_frac", "ratio_to_balance", "diff_vs_balance"):
        rec[col], rec[f"{col}_ci95"] = t_interval(g[col].to_numpy(dtype=float))
    rec["seeds_above_balance"] = int((g.diff_ci95_low > 0).sum())
    rec["seeds_below_balance"] = int((g.diff_ci95_high < 0).sum())
    return rec


def _table(df: pd.DataFrame, cols: list[str]) -> str:
    return df[[c for c in cols if c in df]].to_markdown(index=False, floatfmt=".4g")


def train_seeds(experiment: str, seeds: list[int], folder: Path, timesteps: int | None, jobs: int) -> Path:
    """``agents.train -m experiment=EXPERIMENT seed=...`` into ``folder``; returns it."""
    cmd = [sys.executable, "-m", "agents.train", "-m", f"experiment={experiment}", "seed=" + ",".join(map(str, seeds)),
           f"hydra.sweep.dir={folder}", "eval.final_rounds=0", "logger=tensorboard", "progress_bar=false"]
    if timesteps is not None:
        cmd.append(f"total_timesteps={timesteps}")
    if jobs > 1:
        cmd += ["hydra/launcher=joblib", f"hydra.launcher.n_jobs={jobs}"]
    print("[learned] " + " ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True)
    return folder


def _provenance(runs: list[Path]) -> list[str]:
    """A warning when a policy predates the round streams (its model.zip was chosen on test rounds)."""
    old = [str(r.relative_to(ROOT) if r.is_relative_to(ROOT) else r) for r in runs if "streams" not in json.loads((r / "policy.json").read_text())]
    if not old:
        return []
    return [f"**Caveat:** {', '.join(old)} predate the train/validation/test split: their `model.zip` was chosen on "
            "test rounds 0-99 of this stream, so their rows here are optimistic. Retrain (`--train-seeds`) for a clean table.", ""]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=Path, default=ROOT / "policies" / "paper_k50", help="paper-setting runs: a multirun folder (one run per seed) or one policy folder")
    ap.add_argument("--noisy-runs", type=Path, default=ROOT / "policies" / "noisy_k50", help="noisy-trained runs, as --runs")
    ap.add_argument("--train-seeds", type=str, default=None, help="train experiment=paper_k50 and noisy_k50 for these seeds first, e.g. 0,1,2,3,4")
    ap.add_argument("--train-dir", type=Path, default=ROOT / "outputs" / "learned", help="where --train-seeds puts its runs")
    ap.add_argument("--train-timesteps", type=int, default=None, help="override total_timesteps of --train-seeds (smoke tests)")
    ap.add_argument("--train-jobs", type=int, default=1, help="seeds trained at once (joblib); each uses one thread")
    ap.add_argument("--rounds", type=int, default=500)
    ap.add_argument("--opt-rounds", type=int, default=30)
    ap.add_argument("--gen-rounds", type=int, default=100)
    ap.add_argument("--balance-max-k", type=int, default=200, help="largest K BALANCE is timed at (K = 1000 takes minutes and GBs)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    for name in ("rounds", "opt_rounds", "gen_rounds", "train_jobs"):
        if getattr(args, name) < (1 if name in ("rounds", "train_jobs") else 0):
            ap.error(f"--{name.replace('_', '-')} must be >= {1 if name in ('rounds', 'train_jobs') else 0}, got {getattr(args, name)}")
    if args.train_timesteps is not None and args.train_timesteps < 1:
        ap.error(f"--train-timesteps must be >= 1, got {args.train_timesteps}")
    for flag, folder in (("--train-dir", args.train_dir), ("--out", args.out)):
        require_writable(folder, flag, directory=True)
    seeds = None
    if args.train_seeds is not None:
        try:
            seeds = sorted({int(s) for s in args.train_seeds.split(",") if s.strip()})
        except ValueError:
            ap.error(f"--train-seeds must be comma-separated integers, got {args.train_seeds!r}")
        if not seeds or min(seeds) < 0:
            ap.error(f"--train-seeds must name seeds >= 0, got {args.train_seeds!r}")
    limit_threads(1)
    start = time.perf_counter()
    if seeds is not None:
        args.runs = train_seeds("paper_k50", seeds, args.train_dir / "paper_k50", args.train_timesteps, args.train_jobs)
        args.noisy_runs = train_seeds("noisy_k50", seeds, args.train_dir / "noisy_k50", args.train_timesteps, args.train_jobs)
    runs = find_runs(args.runs)
    noisy_runs = find_runs(args.noisy_runs) if args.noisy_runs.exists() else []
    args.out.mkdir(parents=True, exist_ok=True)
    rel = str(args.runs.relative_to(ROOT)) if args.runs.is_relative_to(ROOT) else str(args.runs)
    md = ["# Learned schedulers vs BALANCE", "", *_provenance(runs + noisy_runs)]

    cfg = _env(runs[0], num_users=50, alpha_cv=0.0, output_cv=0.0)
    paper = [(_label("policy", r), r) for r in runs]
    df, s = compare(cfg, ["balance", "balance_gamma", "ad_only", "sd_only", "greedy"], paper, args.rounds)
    write_csv_atomic(df, args.out / "learned_paper.csv")
    means = pd.DataFrame([seed_mean(s, "policy")])
    vs_gamma = _against(df, "balance_gamma", "policy")
    md += [f"## Paper setting, K = 50, {args.rounds} test rounds, {len(runs)} training seed(s) (`{rel}`)", "",
           "`diff_vs_balance`: mean per-round difference in served fraction (scheduler − BALANCE) on the same rounds, "
           "bootstrap 95 % CI `[diff_ci95_low, diff_ci95_high]`, Wilcoxon signed-rank `p_wilcoxon`.", "",
           _table(s, COLS), "", "Across training seeds (mean, Student-t 95 % CI half-width; seeds whose paired CI is above / below BALANCE):", "",
           _table(means, list(means.columns)), "",
           "The policies choose the draft depth per round (the first SD admission fixes it); BALANCE runs at the fixed "
           "gamma = 4 of the paper. Against `balance_gamma` -- BALANCE that also picks the best gamma in 1..8 per round, "
           "the stronger heuristic -- on the same rounds (policy - balance_gamma; gamma chosen: "
           f"{_gammas(df)}):", "", _table(vs_gamma, list(vs_gamma.columns)), ""]

    if args.opt_rounds > 0:
        df, s = compare(cfg, ["balance", "optimal"], paper, args.opt_rounds, time_limit_s=10.0)
        write_csv_atomic(df, args.out / "learned_optimum.csv")
        cols = ["scheduler", "rounds", "served_frac", "ratio_to_balance", "diff_vs_balance", "diff_ci95_low", "diff_ci95_high", "ratio_to_optimum", "optimum_certified_rounds", "ratio_to_upper_bound"]
        md += [f"Against the optimum on the first {args.opt_rounds} of those rounds (branch and bound, 10 s a round; `ratio_to_optimum` over the rounds where it is certified):", "", _table(s, cols), ""]

    noisy = cfg.replace(alpha_cv=0.3, output_cv=0.3)
    if noisy_runs:
        pols = [(_label("noisy-trained", r), r) for r in noisy_runs] + [(_label("paper policy", r), r) for r in runs]
        df, s = compare(noisy, ["balance", "balance_gamma", "sd_only", "greedy"], pols, args.rounds)
        write_csv_atomic(df, args.out / "learned_noisy.csv")
        means = pd.DataFrame([seed_mean(s, "noisy-trained"), seed_mean(s, "paper policy")])
        vs_gamma = pd.concat([_against(df, "balance_gamma", "noisy-trained"), _against(df, "balance_gamma", "paper policy")], ignore_index=True)
        md += [f"## Noisy predictions (CV 0.3 on acceptance and output), K = 50, {args.rounds} test rounds", "", _table(s, COLS), "",
               "Across training seeds:", "", _table(means, list(means.columns)), "",
               f"Against `balance_gamma` (gamma chosen: {_gammas(df)}):", "", _table(vs_gamma, list(vs_gamma.columns)), ""]
    else:
        md += [f"(noisy-trained runs: {args.noisy_runs} not found, section skipped)", ""]

    gen, gen_means = [], []
    for k in (20, 30, 70, 100):
        df, s = compare(cfg.replace(num_users=k), ["balance"], paper, args.gen_rounds)
        gen.append(s.assign(K=k))
        gen_means.append({"K": k, **seed_mean(s, "policy")})
    g = pd.concat(gen, ignore_index=True)
    write_csv_atomic(g, args.out / "learned_generalisation.csv")
    gm = pd.DataFrame(gen_means)
    md += [f"## Generalisation: the K = 50 policies on other round sizes ({args.gen_rounds} test rounds each)", "",
           _table(gm, list(gm.columns)), "", "Per seed:", "", _table(g, ["K", *COLS]), ""]

    timing = []
    for k, n in ((50, 10), (200, 3), (1000, 1)):
        names = ["balance"] if k <= args.balance_max_k else []
        df, s = compare(cfg.replace(num_users=k), names, [(_label("policy", runs[0]), runs[0])], n)
        timing.append(s.assign(K=k))
    t = pd.concat(timing, ignore_index=True)
    write_csv_atomic(t, args.out / "learned_timing.csv")
    md += ["## Decision time per round", "", _table(t, ["K", "scheduler", "rounds", "served_frac", "decision_ms_median"]), ""]
    how = " ".join(sys.argv[1:] if argv is None else argv)
    md += [f"Reproduce: `python -m experiments.learned {how}` ({time.perf_counter() - start:.0f} s here"
           + (", training included" if seeds is not None else ", evaluating already trained runs") + ").", ""]
    write_text_atomic(args.out / "learned.md", "\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    main()
