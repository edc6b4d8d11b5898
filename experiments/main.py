"""The README's main job: RL policies trained from several seeds, compared with BALANCE, the baselines and the optimum.

    bash scripts/main.sh                      # set up, then this on its embedded defaults
    python -m experiments.main [--seeds 0,1,2,3,4] [--rounds 100] [HYDRA_OVERRIDES...] [--out DIR] [--publish]

Defaults: ``conf/train.yaml`` with ``experiment=quick`` (MaskablePPO, K = 12, 60k decisions per
seed: about a minute per seed on an idle CPU; W&B offline), trained from **five seeds** (``--seeds``),
one run folder each (``DIR/seed<S>/``). Then every scheduler plans the same **test** rounds
(``envs.workload``: the policies trained on the train stream and were chosen on validation rounds):
BALANCE, AD-only, SD-only, greedy and the exact optimum (cheap at K = 12) once, each seed's policy
on the same rounds. Reported (printed, and written to ``DIR/main_job.md``):

* per seed: the policy's served fraction and its **paired** difference to BALANCE per round
  (bootstrap 95 % CI, Wilcoxon signed-rank p; ``agents.paired_stats``);
* across seeds: the mean and its Student-t 95 % CI (the seeds are the independent replicates of
  the training recipe; it measures training-seed variation only, as every seed is judged on the
  same rounds), and the seed-averaged policy's paired difference to BALANCE per round (bootstrap
  95 % CI over the rounds, Wilcoxon p: the round-sampling uncertainty);
* the other schedulers' table with their paired difference to BALANCE on the same rounds.

Files in ``DIR``: ``comparison.csv`` (one row per scheduler, round and -- for the policy -- seed),
``seeds.csv`` (per-seed rows and the across-seed mean), ``comparison_summary.{csv,md}`` (the other
schedulers), ``main_job.md``, ``served_fraction.png`` (served fraction per scheduler; the policy
is the across-seed mean with its CI, seeds as dots) and ``learning_curve.png`` (every seed's
validation curve against BALANCE, and their mean). ``--publish`` copies ``main_job.md`` to
``results/main_job.md`` (the README's copy).
"""

from __future__ import annotations

import argparse
import copy
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from agents.artefacts import (  # noqa: E402
    require_writable,
    save_figure_atomic,
    write_csv_atomic,
    write_text_atomic,
)
from agents.evaluate import evaluate_schedulers, format_summary, summarize  # noqa: E402
from agents.paired_stats import paired_difference, t_interval  # noqa: E402
from agents.train import TrainConfig, train  # noqa: E402
from envs.workload import make_rounds  # noqa: E402
from experiments import aggregate  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OTHERS = ["balance", "ad_only", "sd_only", "greedy", "optimal"]  #: evaluated once; the policy once per seed
SCHEDULERS = ["policy", *OTHERS]
DEFAULT_SEEDS = "0,1,2,3,4"
MAX_ROUNDS = 100_000  #: test rounds of the comparison (the exact optimum runs on every one)
SEED_COLS = ["seed", "served_frac", "balance_served_frac", "ratio_to_balance", "diff_vs_balance", "diff_ci95_low", "diff_ci95_high", "p_wilcoxon", "best_validation_ratio", "timesteps", "train_s"]
#: ``seeds.csv``'s ``mean`` row: across-seed means, ``<col>_t_ci95`` (Student-t half-widths), and in
#: ``diff_ci95_low/high`` / ``p_wilcoxon`` the seed-averaged policy's paired comparison over rounds
MEAN_COLS = ["served_frac_t_ci95", "ratio_to_balance_t_ci95", "diff_vs_balance_t_ci95"]


def parse_seeds(text: str) -> list[int]:
    """``"0,1,2"`` -> ``[0, 1, 2]``: distinct integers in ``[0, 2**32)``, at least one."""
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"--seeds takes comma-separated integers, got {text!r}") from None
    if not seeds:
        raise ValueError("--seeds names no seed")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds repeats a seed: {text!r}")
    bad = [s for s in seeds if not 0 <= s < 2**32]
    if bad:
        raise ValueError(f"--seeds must be in [0, 2**32), got {bad}")
    return seeds


def learning_curve(progress_csv: Path) -> pd.DataFrame:
    """Validation rows of ``progress.csv``: ``time/total_timesteps`` and ``eval/ratio_to_balance`` (may be empty)."""
    cols = ["time/total_timesteps", "eval/served_frac", "eval/ratio_to_balance"]
    if not progress_csv.is_file():
        return pd.DataFrame(columns=cols)
    prog = pd.read_csv(progress_csv)
    if not set(cols) <= set(prog.columns):
        return pd.DataFrame(columns=cols)
    return prog.dropna(subset=cols)[cols].drop_duplicates(subset=["time/total_timesteps"], keep="last").sort_values("time/total_timesteps")


def _savefig(fig, path: Path) -> Path:
    return save_figure_atomic(fig, path)  # a kill never leaves a half-written picture


def seed_rows(runs: dict[int, Path], evaluations: dict[int, pd.DataFrame], train_s: dict[int, float]) -> pd.DataFrame:
    """One row per seed: the policy vs BALANCE on the same test rounds (paired), its best validation ratio."""
    rows = []
    for seed, run in runs.items():
        row = aggregate.run_row(run, evaluation=evaluations[seed])
        row["seed"] = seed
        row["train_s"] = train_s.get(seed, np.nan)
        rows.append(row)
    return pd.DataFrame(rows)


def across_seeds(rows: pd.DataFrame, policies: dict[int, pd.DataFrame] | None = None, balance: pd.DataFrame | None = None) -> dict[str, float]:
    """Mean and Student-t 95 % CI half-width (``<col>_ci95``) across seeds, and how many seeds' paired CIs exclude 0.

    With each seed's policy rows and BALANCE's rows on the same rounds, also the seed-averaged
    policy's paired difference to BALANCE per round (``pooled_diff``, ``pooled_ci95_low/high``,
    ``pooled_p_wilcoxon``): the per-round served fraction averaged over seeds minus BALANCE's,
    bootstrap 95 % CI over rounds -- the uncertainty from the choice of rounds, which the
    across-seed t-CI does not contain (every seed is judged on the same rounds).
    """
    out: dict[str, float] = {"seeds": len(rows)}
    if policies and balance is not None:
        frac = pd.concat([p.assign(f=p.served / p.num_users).set_index("round").f.rename(s) for s, p in policies.items()], axis=1).mean(axis=1)
        ref = balance.assign(f=balance.served / balance.num_users).set_index("round").f
        both = pd.concat([frac.rename("policy"), ref.rename("balance")], axis=1).dropna()
        d = paired_difference(both.policy.to_numpy(), both.balance.to_numpy())
        out.update(pooled_diff=d.mean, pooled_ci95_low=d.ci_low, pooled_ci95_high=d.ci_high, pooled_p_wilcoxon=d.p_value)
    for col in ("served_frac", "ratio_to_balance", "diff_vs_balance", "best_validation_ratio"):
        out[col], out[f"{col}_ci95"] = t_interval(rows[col].to_numpy(dtype=float))
    out["seeds_above_balance"] = int((rows.diff_ci95_low > 0).sum())
    out["seeds_below_balance"] = int((rows.diff_ci95_high < 0).sum())
    return out


def plot(summary: pd.DataFrame, rows: pd.DataFrame, mean: dict[str, float], runs: dict[int, Path], out: Path) -> list[Path]:
    """``served_fraction.png`` (policy = across-seed mean, t-CI, seeds as dots) and ``learning_curve.png`` (every seed)."""
    paths = []
    n = len(rows)
    names = [f"policy\n({n} seed{'s' if n > 1 else ''})", *summary.scheduler]
    vals = [mean["served_frac"], *summary.served_frac]
    errs = [mean["served_frac_ci95"] if np.isfinite(mean["served_frac_ci95"]) else 0.0, *summary.ci95.fillna(0.0)]
    fig, ax = plt.subplots(figsize=(7, 3.4))
    ax.bar(range(len(names)), vals, yerr=errs, capsize=3, color=["#dd8452", *["#4c72b0"] * len(summary)])
    ax.scatter(np.zeros(n) + np.linspace(-0.2, 0.2, n), rows.served_frac, color="black", s=10, zorder=3, label="one training seed")
    ax.set_xticks(range(len(names)), names, fontsize=8)
    ax.set_ylabel("served fraction")
    ax.set_ylim(0, 1)
    ax.set_title("Same test rounds for every scheduler (policy: mean of seeds, t 95 % CI; others: 95 % CI over rounds)", fontsize=8)
    for x, v in enumerate(vals):
        ax.text(x, v + 0.03, f"{v:.3f}", ha="center", fontsize=8)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    paths.append(_savefig(fig, out / "served_fraction.png"))

    curves = {seed: aggregate.learning_curve(run) for seed, run in runs.items()}
    curves = {s: c for s, c in curves.items() if len(c)}
    if curves:
        fig, ax = plt.subplots(figsize=(6, 3.4))
        for seed, c in curves.items():
            ax.plot(c.timesteps, c.ratio_to_balance, lw=0.9, alpha=0.6, marker=".", label=f"seed {seed}")
        stacked = pd.concat([c.set_index("timesteps").ratio_to_balance for c in curves.values()], axis=1).dropna()
        if len(stacked) and len(curves) > 1:
            ax.plot(stacked.index, stacked.mean(axis=1).to_numpy(), lw=2.2, color="black", label="mean of seeds")
        ax.axhline(1.0, color="grey", ls="--", label="BALANCE")
        ax.set_xlabel("decisions (timesteps)")
        ax.set_ylabel("served / BALANCE (validation)")
        ax.legend(fontsize=7)
        fig.tight_layout()
        paths.append(_savefig(fig, out / "learning_curve.png"))
    return paths


def _pp(mean: float, lo: float, hi: float) -> str:
    return f"{mean * 100:+.2f} pp [{lo * 100:.2f}, {hi * 100:.2f}]"


def markdown(rows: pd.DataFrame, mean: dict[str, float], summary: pd.DataFrame, tc: TrainConfig, rounds: int, total_s: float,
             reproduce: str) -> str:
    """The main job's report: per-seed rows, the across-seed mean, the other schedulers (all on the same test rounds)."""
    n = len(rows)
    per_seed = pd.DataFrame({
        "seed": rows.seed.astype(int).astype(str),
        "served_frac": [f"{v:.4f}" for v in rows.served_frac],
        "ratio_to_balance": [f"{v:.4f}" for v in rows.ratio_to_balance],
        "policy − BALANCE (paired, 95 % CI)": [_pp(r.diff_vs_balance, r.diff_ci95_low, r.diff_ci95_high) for r in rows.itertuples()],
        "p_wilcoxon": [f"{v:.3g}" for v in rows.p_wilcoxon],
        "best validation ratio": [f"{v:.4f}" for v in rows.best_validation_ratio],
        "train (s)": [f"{v:.0f}" for v in rows.train_s],
    })
    lo, hi = mean["diff_vs_balance"] - mean["diff_vs_balance_ci95"], mean["diff_vs_balance"] + mean["diff_vs_balance_ci95"]
    per_seed.loc[len(per_seed)] = {
        "seed": f"**mean of {n}** (t 95 % CI)",
        "served_frac": f"{mean['served_frac']:.4f} ± {mean['served_frac_ci95']:.4f}",
        "ratio_to_balance": f"{mean['ratio_to_balance']:.4f} ± {mean['ratio_to_balance_ci95']:.4f}",
        "policy − BALANCE (paired, 95 % CI)": _pp(mean["diff_vs_balance"], lo, hi),
        "p_wilcoxon": "",
        "best validation ratio": f"{mean['best_validation_ratio']:.4f} ± {mean['best_validation_ratio_ci95']:.4f}",
        "train (s)": f"{rows.train_s.sum():.0f} (total)",
    }
    cols = ["scheduler", "rounds", "served_frac", "ci95", "ratio_to_balance", "diff_vs_balance", "diff_ci95_low", "diff_ci95_high", "p_wilcoxon", "ratio_to_optimum", "decision_ms_median"]
    return "\n".join([
        f"Learned policy ({tc.agent.algo}, K = {tc.env.num_users}, {n} training seed{'s' if n > 1 else ''}) vs BALANCE on the same {rounds} **test** rounds "
        f"(test stream, seed {tc.eval.seed}; each policy trained on the train stream and was chosen on {tc.eval.rounds} validation rounds). "
        "Per seed: the mean per-round difference in served fraction (percentage points), bootstrap 95 % CI, Wilcoxon signed-rank p; "
        f"mean of seeds: Student-t 95 % CI across seeds (training-seed variation only: every seed is judged on the same rounds). "
        f"Seeds whose paired CI lies above BALANCE: {mean['seeds_above_balance']}, below: {mean['seeds_below_balance']}.", "",
        per_seed.to_markdown(index=False), "",
        *([f"Seed-averaged policy − BALANCE per round (the rounds' uncertainty: bootstrap 95 % CI over the {rounds} rounds, Wilcoxon p): "
           f"**{_pp(mean['pooled_diff'], mean['pooled_ci95_low'], mean['pooled_ci95_high'])}**, p = {mean['pooled_p_wilcoxon']:.3g}.", ""] if "pooled_diff" in mean else []),
        f"The other schedulers on the same {rounds} test rounds (`diff_vs_balance`: paired difference to BALANCE, bootstrap 95 % CI, Wilcoxon p):", "",
        summary[[c for c in cols if c in summary]].to_markdown(index=False, floatfmt=".4g"), "",
        f"{tc.total_timesteps} decisions asked per seed ({rows.timesteps.max():.0f} trained: whole rollouts), {tc.threads} torch thread(s); "
        f"the whole job took {total_s / 60:.1f} min here. Reproduce: `{reproduce}`.", "",
    ])


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None, help="output folder (default outputs/main/TIMESTAMP)")
    ap.add_argument("--seeds", default=DEFAULT_SEEDS, help=f"comma-separated training seeds (default {DEFAULT_SEEDS})")
    ap.add_argument("--rounds", type=int, default=100, help="test rounds in the comparison")
    ap.add_argument("--publish", action="store_true", help="also write results/main_job.md (the README's copy)")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides for conf/train.yaml, e.g. total_timesteps=20000")
    args = ap.parse_args(argv)
    if not 1 <= args.rounds <= MAX_ROUNDS:  # the rounds are built only after every seed has trained
        ap.error(f"--rounds must be an integer in [1, {MAX_ROUNDS}], got {args.rounds}")
    if args.out is not None:
        require_writable(args.out, "--out", directory=True)
    try:
        seeds = parse_seeds(args.seeds)
    except ValueError as err:
        ap.error(str(err))
    if any(o.lstrip("+~").split("=", 1)[0] in ("seed", "output_dir") for o in args.overrides):
        ap.error("set training seeds with --seeds and the folder with --out, not seed= / output_dir= overrides")
    start = time.perf_counter()
    out = args.out or ROOT / "outputs" / "main" / time.strftime("%Y-%m-%d_%H-%M-%S")
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["experiment=quick", "eval.final_rounds=0", *args.overrides])
    raw = OmegaConf.to_container(cfg, resolve=True)
    if not any(o.lstrip("+~").startswith("logger.stdout") for o in args.overrides):
        raw["logger"]["stdout"] = "line"  # five seeds' SB3 tables would bury the job's own progress lines
    tc = TrainConfig.from_dict(raw)

    runs: dict[int, Path] = {}
    train_s: dict[int, float] = {}
    for i, seed in enumerate(seeds, 1):
        run = out / f"seed{seed}"
        print(f"[main] seed {seed} ({i}/{len(seeds)}): training {tc.agent.algo} on K={tc.env.num_users} for {tc.total_timesteps} decisions -> {run}", flush=True)
        raw_s = copy.deepcopy(raw)
        raw_s["seed"] = seed
        result = train(raw_s, run)
        runs[seed], train_s[seed] = run, float(result["train_s"])
        print(f"[main] seed {seed} ({i}/{len(seeds)}): trained in {result['train_s']:.0f} s ({result['steps_per_s']:.0f} decisions/s)", flush=True)

    rnds = make_rounds(tc.env, args.rounds, tc.eval.seed, split="test")
    print(f"[main] {', '.join(OTHERS)} on {args.rounds} test rounds", flush=True)
    others = evaluate_schedulers(tc.env, OTHERS, rounds=rnds, seed=tc.eval.seed, draft_depth=tc.draft_depth, progress=True, time_limit_s=10.0)
    balance = others[others.scheduler == "balance"]
    policies: dict[int, pd.DataFrame] = {}
    for i, seed in enumerate(seeds, 1):
        print(f"[main] seed {seed} ({i}/{len(seeds)}): policy on the same {args.rounds} test rounds", flush=True)
        policies[seed] = evaluate_schedulers(tc.env, ["policy"], rounds=rnds, seed=tc.eval.seed, draft_depth=tc.draft_depth, policy_path=str(runs[seed])).assign(seed=seed)
    write_csv_atomic(pd.concat([*policies.values(), others], ignore_index=True), out / "comparison.csv")

    rows = seed_rows(runs, {s: pd.concat([balance, p.drop(columns="seed")], ignore_index=True) for s, p in policies.items()}, train_s)
    mean = across_seeds(rows, policies, balance)
    mean_row = {**{k: v for k, v in mean.items() if k in SEED_COLS}, "seed": "mean", "diff_ci95_low": mean["pooled_ci95_low"], "diff_ci95_high": mean["pooled_ci95_high"], "p_wilcoxon": mean["pooled_p_wilcoxon"]}
    mean_row.update({f"{c}_t_ci95": mean[f"{c}_ci95"] for c in ("served_frac", "ratio_to_balance", "diff_vs_balance")})
    write_csv_atomic(pd.concat([rows[SEED_COLS], pd.DataFrame([mean_row])], ignore_index=True)[SEED_COLS + MEAN_COLS], out / "seeds.csv")
    summary = summarize(others)
    write_csv_atomic(summary, out / "comparison_summary.csv")
    write_text_atomic(out / "comparison_summary.md", format_summary(summary) + "\n")
    for p in plot(summary, rows, mean, runs, out):
        print(f"[main] wrote {p}")
    # the command this run was: a run without --publish must not tell its reader to overwrite the README's copy
    reproduce = " ".join(["bash scripts/main.sh", "--seeds", ",".join(map(str, seeds)), *(["--rounds", str(args.rounds)] if args.rounds != 100 else []),
                          *args.overrides, *(["--publish"] if args.publish else [])])
    text = markdown(rows, mean, summary, tc, args.rounds, time.perf_counter() - start, reproduce)
    write_text_atomic(out / "main_job.md", text)
    print(text)
    if args.publish:
        print(f"[main] wrote {write_text_atomic(ROOT / 'results' / 'main_job.md', text)}")
    return out


if __name__ == "__main__":
    main()
