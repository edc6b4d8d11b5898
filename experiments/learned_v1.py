"""A learned scheduler on EdgeSchedule-v1 (SpecEdge split) against the best heuristic, over training seeds, on test rounds.

    python -m agents.train -m experiment=split_k20 seed=0,1,2,3,4 hydra.sweep.dir=runs/split_k20_seeds   # train (or one output_dir per seed)
    python -m experiments.learned_v1 --runs runs/split_k20_seeds --ship policies/split_k20                 # the table

Heuristics: ``balance`` (v0 modes only), ``balance_ed`` (BALANCE with ED placed around it) and
``edge_first`` (every edge user to ED at its calibrated depth, the rest by BALANCE). The
**reference** is whichever of ``balance_ed`` / ``edge_first`` serves more on the test rounds (the
harder bar). Every seed's policy and the heuristics play the same ``--rounds`` rounds of the
**test** stream (seed 1000003, ``envs.workload``); the policies trained on the train stream and had
``model.zip`` chosen on the validation stream, so none of these rounds chose anything. Per seed:
the paired per-round difference to the reference (bootstrap 95 % CI, Wilcoxon signed-rank) and
the ratio of users served; across seeds: the mean difference with its Student-t 95 % CI. With
``--opt-rounds`` the policies also play rounds of ``--opt-k`` users (<= 8, where the exact
``optimal_v1`` runs) against it -- a generalisation check: the policy was trained at its own K.

``--ship DIR`` copies the small files (``model.zip``, ``policy.json``, ``policy.onnx``, ``config.yaml``, ``progress.csv``) of the run
with the best **validation** score (``eval/served_frac`` in its ``progress.csv``) to ``DIR``.
Writes ``OUT/learned_v1.{md,png}``, ``OUT/learned_v1_rounds.csv`` (one row per scheduler and round),
``OUT/learned_v1_seeds.csv`` (per-seed and across-seed rows), ``OUT/learned_v1_optimum.csv``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from agents.artefacts import save_figure_atomic, write_csv_atomic, write_text_atomic
from agents.evaluate import summarize
from agents.evaluate_v1 import evaluate_schedulers_v1
from agents.paired_stats import paired_difference, t_interval
from agents.policy import resolve_policy_path
from agents.threads import limit_threads
from envs.config import EnvConfig
from envs.workload import make_rounds
from experiments.aggregate import find_runs, run_seed

ROOT = Path(__file__).resolve().parent.parent
SEED = 1000003  #: the test stream's seed (the training's eval.seed; validation is a disjoint stream of it)
HEURISTICS = ["balance", "balance_ed", "edge_first"]
CANDIDATES = ("balance_ed", "edge_first")  #: the reference is the better of these on the test rounds
SHIP_FILES = ("model.zip", "policy.json", "policy.onnx", "config.yaml", "progress.csv")


def validation_score(run: Path) -> float:
    """The run's best validation served fraction (what chose its ``model.zip``); -1 when none was logged."""
    path = run / "progress.csv"
    if not path.is_file():
        return -1.0
    col = pd.read_csv(path).get("eval/served_frac")
    return float(col.max()) if col is not None and col.notna().any() else -1.0


def play(cfg: EnvConfig, runs: list[Path], rounds: int, heuristics: list[str], progress: bool = True) -> pd.DataFrame:
    """Heuristics once and every run's policy (labelled ``policy s<seed>``) on the same test rounds."""
    rnds = make_rounds(cfg, rounds, SEED, split="test")
    parts = [evaluate_schedulers_v1(cfg, heuristics, rounds=rnds, seed=SEED, progress=progress)]
    for run in runs:
        df = evaluate_schedulers_v1(cfg, ["policy"], rounds=rnds, seed=SEED, progress=progress, policy_path=str(run))
        parts.append(df.assign(scheduler=f"policy s{run_seed(run)}"))
    return pd.concat(parts, ignore_index=True)


def seed_table(df: pd.DataFrame, reference: str) -> pd.DataFrame:
    """Per seed: served fraction, ratio to ``reference`` and the paired difference (bootstrap CI); then the seeds' mean (t CI)."""
    ref = df[df.scheduler == reference].set_index("round").sort_index()
    rows = []
    for name, g in df[df.scheduler.str.startswith("policy s")].groupby("scheduler", sort=False):
        g = g.set_index("round").sort_index()
        d = paired_difference((g.served / g.num_users).to_numpy(), (ref.served / ref.num_users).loc[g.index].to_numpy())
        rows.append({"policy": name, "rounds": len(g), "served_frac": float((g.served / g.num_users).mean()),
                     "ratio_to_reference": float(g.served.sum() / max(ref.served.loc[g.index].sum(), 1)),
                     "diff_vs_reference": d.mean, "diff_ci95_low": d.ci_low, "diff_ci95_high": d.ci_high, "p_wilcoxon": d.p_value})
    out = pd.DataFrame(rows)
    mean = {"policy": f"mean of {len(out)} seeds", "rounds": int(out.rounds.iloc[0]) if len(out) else 0}
    for col in ("served_frac", "ratio_to_reference", "diff_vs_reference"):
        m, h = t_interval(out[col].to_numpy())
        mean[col] = m
        if col == "diff_vs_reference":
            mean["diff_ci95_low"], mean["diff_ci95_high"] = m - h, m + h
        else:
            mean[f"{col}_ci95"] = h
    mean["p_wilcoxon"] = np.nan
    return pd.concat([out, pd.DataFrame([mean])], ignore_index=True).assign(reference=reference)


def figure(df: pd.DataFrame, seeds: pd.DataFrame, reference: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    frac = df.assign(f=df.served / df.num_users).groupby("scheduler", sort=False).f
    names = list(frac.mean().index)
    a.bar(range(len(names)), frac.mean().to_numpy(), yerr=1.96 * frac.sem().to_numpy(), color=["#888" if not n.startswith("policy") else "#3a7" for n in names])
    a.set_xticks(range(len(names)), names, rotation=40, ha="right")
    a.set_ylim(max(0.0, frac.mean().min() - 0.1), 1.0)
    a.set_ylabel("served fraction (test rounds, 95 % CI)")
    per = seeds[seeds.policy.str.startswith("policy s")]
    y = np.arange(len(seeds))
    lo, hi = seeds.diff_ci95_low.to_numpy(), seeds.diff_ci95_high.to_numpy()
    b.errorbar(seeds.diff_vs_reference, y, xerr=[seeds.diff_vs_reference - lo, hi - seeds.diff_vs_reference], fmt="o", color="#3a7")
    b.axvline(0.0, color="k", lw=0.8)
    b.set_yticks(y, list(per.policy) + [seeds.policy.iloc[-1]])
    b.set_xlabel(f"served fraction, policy - {reference} (paired, 95 % CI)")
    fig.tight_layout()
    return fig


def ship(runs: list[Path], dest: Path) -> Path:
    """Copy the best-on-validation run's small files to ``dest``; returns that run."""
    best = max(runs, key=lambda r: (validation_score(r), -run_seed(r)))
    dest.mkdir(parents=True, exist_ok=True)
    for name in SHIP_FILES:
        if (best / name).is_file():
            tmp = dest / f".{name}.tmp"
            shutil.copyfile(best / name, tmp)
            tmp.replace(dest / name)
    return best


def main(argv: list[str] | None = None) -> pd.DataFrame:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=Path, default=ROOT / "runs" / "split_k20_seeds", help="folder of v1 training runs (one per seed) or one policy folder")
    ap.add_argument("--rounds", type=int, default=500, help="test rounds")
    ap.add_argument("--opt-rounds", type=int, default=0, help="test rounds of --opt-k users against optimal_v1 (0 = skip)")
    ap.add_argument("--opt-k", type=int, default=8, help="users per round of the optimum comparison (optimal_v1 runs to 8)")
    ap.add_argument("--ship", type=Path, default=None, help="copy the best-on-validation policy's small files here")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "learned_v1")
    ap.add_argument("--quiet", action="store_true", help="no progress bars")
    args = ap.parse_args(argv)
    if args.rounds < 2:
        ap.error(f"--rounds must be >= 2 (paired CIs), got {args.rounds}")
    if args.opt_rounds < 0 or not 1 <= args.opt_k <= 8:
        ap.error(f"--opt-rounds must be >= 0 and --opt-k in [1, 8], got {args.opt_rounds} and {args.opt_k}")
    limit_threads(1)
    start = time.perf_counter()
    runs = find_runs(args.runs)
    _, meta = resolve_policy_path(runs[0])
    if meta.get("env_id") != "EdgeSchedule-v1":
        raise SystemExit(f"{runs[0]} was trained on {meta.get('env_id', 'EdgeSchedule-v0')}, not EdgeSchedule-v1")
    cfg = EnvConfig.from_kwargs(**meta["env"])
    args.out.mkdir(parents=True, exist_ok=True)
    df = play(cfg, runs, args.rounds, HEURISTICS, progress=not args.quiet)
    write_csv_atomic(df, args.out / "learned_v1_rounds.csv")
    means = df.groupby("scheduler").served.mean()
    reference = max(CANDIDATES, key=lambda n: means[n])
    seeds = seed_table(df, reference)
    write_csv_atomic(seeds, args.out / "learned_v1_seeds.csv")
    # summarize names its ratio column after BALANCE; here it is the ratio to the reference
    summary = summarize(df, reference=reference).rename(columns={"ratio_to_balance": f"ratio_to_{reference}"})
    rel = str(args.runs.relative_to(ROOT)) if args.runs.is_relative_to(ROOT) else str(args.runs)
    val = pd.DataFrame([{"run": r.name, "seed": run_seed(r), "validation_served_frac": validation_score(r)} for r in runs])
    last = seeds.iloc[-1]
    holds = bool(last.ratio_to_reference >= 1.0)
    significance = ("the across-seed 95 % CI of the paired difference lies above 0" if last.diff_ci95_low > 0 else
                    "the across-seed 95 % CI of the paired difference lies below 0" if last.diff_ci95_high < 0 else
                    "the across-seed 95 % CI of the paired difference includes 0: not significantly different")
    md = ["# A learned scheduler on EdgeSchedule-v1 vs the best heuristic", "",
          f"K = {cfg.num_users}, edge fraction {cfg.edge_fraction}, profile `{cfg.profile}`, RTT {cfg.rtt_ms} ms, user order `{cfg.user_order}`; "
          f"{args.rounds} **test** rounds (seed {SEED}); {len(runs)} training seeds from `{rel}` (MaskablePPO, trained on the train stream, "
          "`model.zip` chosen on 100 validation rounds).", "",
          f"Reference: `{reference}` (the better of {', '.join(f'`{c}`' for c in CANDIDATES)} on these rounds: "
          + ", ".join(f"{c} {means[c] / cfg.num_users:.4f}" for c in CANDIDATES) + " served fraction).", "",
          "## Per seed, paired against the reference", "",
          "`diff_vs_reference`: mean per-round difference in served fraction (policy − reference), bootstrap 95 % CI; last row: mean over "
          "seeds with its Student-t 95 % CI.", "", seeds.drop(columns="reference").to_markdown(index=False, floatfmt=".4g"), "",
          f"**Target ≥ 1.00× the best heuristic: {'holds on the mean' if holds else 'not met'}** ({significance}; mean ratio {last.ratio_to_reference:.4f}, "
          f"mean paired difference {last.diff_vs_reference:+.4f} [{last.diff_ci95_low:+.4f}, {last.diff_ci95_high:+.4f}]; "
          f"{int((seeds.diff_ci95_low.iloc[:-1] > 0).sum())} seed(s) significantly above, {int((seeds.diff_ci95_high.iloc[:-1] < 0).sum())} below).", "",
          "## All schedulers", "", summary.to_markdown(index=False, floatfmt=".4g"), "",
          "Validation scores (what chose each `model.zip`):", "", val.to_markdown(index=False, floatfmt=".4g"), ""]
    if args.ship is not None:
        best = ship(runs, args.ship)
        md += [f"Shipped: `{args.ship.relative_to(ROOT) if args.ship.is_relative_to(ROOT) else args.ship}` = run `{best.name}` "
               f"(best validation served fraction {validation_score(best):.4f}).", ""]
    if args.opt_rounds > 0:
        small = cfg.replace(num_users=args.opt_k)
        opt = play(small, runs, args.opt_rounds, ["balance_ed", "edge_first", "optimal_v1"], progress=not args.quiet)
        write_csv_atomic(opt, args.out / "learned_v1_optimum.csv")
        o = opt.groupby("scheduler", sort=False).served.sum()
        tab = pd.DataFrame({"scheduler": o.index, "served_frac": o.to_numpy() / (args.opt_k * args.opt_rounds), "ratio_to_optimum": o.to_numpy() / o["optimal_v1"]})
        md += [f"## Against the exact optimum (`optimal_v1`), K = {args.opt_k}, {args.opt_rounds} test rounds", "",
               f"The K = {cfg.num_users} policies on smaller rounds (a generalisation check; look-ahead padded).", "",
               tab.to_markdown(index=False, floatfmt=".4g"), ""]
    save_figure_atomic(figure(df, seeds, reference), args.out / "learned_v1.png")
    how = " ".join(sys.argv[1:] if argv is None else argv)
    md += [f"Generated by `python -m experiments.learned_v1 {how}` ({time.perf_counter() - start:.0f} s).", ""]
    write_text_atomic(args.out / "learned_v1.md", "\n".join(md))
    print("\n".join(md))
    return seeds


if __name__ == "__main__":
    main()
