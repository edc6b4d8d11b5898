"""The README's main job: a short RL training run compared with BALANCE, the baselines and the optimum.

    bash scripts/main.sh                      # set up, then this on its embedded defaults
    python -m experiments.main [HYDRA_OVERRIDES...] [--out DIR]

Defaults: ``conf/train.yaml`` with ``experiment=quick`` (MaskablePPO, K = 12, 60k decisions:
a few minutes on 2 CPUs; W&B offline). Then every scheduler -- the trained policy, BALANCE,
AD-only, SD-only, greedy and the exact optimum (cheap at K = 12) -- plans the same **test** rounds
(``envs.workload``: the policy trained on the train stream and was chosen on validation rounds);
the table, with each scheduler's paired difference to BALANCE, is printed and saved, and two plots
are written: served fraction per scheduler, and the validation learning curve against BALANCE.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from agents.artefacts import write_csv_atomic, write_text_atomic  # noqa: E402
from agents.evaluate import evaluate_schedulers, format_summary, summarize  # noqa: E402
from agents.train import TrainConfig, train  # noqa: E402
from envs.workload import make_rounds  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SCHEDULERS = ["policy", "balance", "ad_only", "sd_only", "greedy", "optimal"]


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
    tmp = path.with_name(f".{path.stem}.tmp{path.suffix}")
    fig.savefig(tmp, dpi=120)
    tmp.replace(path)  # atomic: a kill never leaves a half-written picture
    plt.close(fig)
    return path


def plot(summary: pd.DataFrame, progress_csv: Path, out: Path) -> list[Path]:
    paths = []
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.bar(summary.scheduler, summary.served_frac, yerr=summary.ci95, capsize=3, color="#4c72b0")
    ax.set_ylabel("served fraction")
    ax.set_ylim(0, 1)
    ax.set_title("Same held-out rounds for every scheduler", fontsize=9)
    for x, v in enumerate(summary.served_frac):
        ax.text(x, v + 0.02, f"{v:.3f}", ha="center", fontsize=8)
    fig.tight_layout()
    paths.append(_savefig(fig, out / "served_fraction.png"))
    curve = learning_curve(progress_csv)
    if len(curve):
        fig, ax = plt.subplots(figsize=(6, 3.2))
        ax.plot(curve["time/total_timesteps"], curve["eval/ratio_to_balance"], marker="o")
        ax.axhline(1.0, color="grey", ls="--", label="BALANCE")
        ax.set_xlabel("decisions (timesteps)")
        ax.set_ylabel("served / BALANCE (validation)")
        ax.legend()
        fig.tight_layout()
        paths.append(_savefig(fig, out / "learning_curve.png"))
    return paths


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None, help="output folder (default outputs/main/TIMESTAMP)")
    ap.add_argument("--rounds", type=int, default=100, help="test rounds in the comparison")
    ap.add_argument("--publish", action="store_true", help="also write results/main_job.md (the README's copy)")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides for conf/train.yaml, e.g. total_timesteps=20000")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error(f"--rounds must be >= 1, got {args.rounds}")
    out = args.out or ROOT / "outputs" / "main" / time.strftime("%Y-%m-%d_%H-%M-%S")
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["experiment=quick", "eval.final_rounds=0", *args.overrides])
    raw = OmegaConf.to_container(cfg, resolve=True)
    tc = TrainConfig.from_dict(raw)
    print(f"[main] training {tc.agent.algo} on K={tc.env.num_users} for {tc.total_timesteps} decisions -> {out}")
    result = train(raw, out)
    print(f"[main] trained in {result['train_s']:.0f} s ({result['steps_per_s']:.0f} decisions/s)")
    print(f"[main] comparing on {args.rounds} test rounds")
    df = evaluate_schedulers(tc.env, SCHEDULERS, rounds=make_rounds(tc.env, args.rounds, tc.eval.seed, split="test"), seed=tc.eval.seed, gamma=tc.gamma, progress=True, policy_path=str(out), time_limit_s=10.0)
    write_csv_atomic(df, out / "comparison.csv")
    summary = summarize(df)
    write_csv_atomic(summary, out / "comparison_summary.csv")
    table = format_summary(summary)
    write_text_atomic(out / "comparison_summary.md", table + "\n")
    print(table)
    for p in plot(summary, out / "progress.csv", out):
        print(f"[main] wrote {p}")
    if args.publish:
        publish(summary, result, tc, args.rounds)


def publish(summary: pd.DataFrame, result: dict, tc: TrainConfig, rounds: int) -> Path:
    path = ROOT / "results" / "main_job.md"
    cols = ["scheduler", "rounds", "served_frac", "ci95", "ratio_to_balance", "diff_vs_balance", "diff_ci95_low", "diff_ci95_high", "p_wilcoxon", "ratio_to_optimum", "decision_ms_median"]
    text = "\n".join([
        summary[[c for c in cols if c in summary]].to_markdown(index=False, floatfmt=".4g"), "",
        f"{tc.agent.algo}, K = {tc.env.num_users}, seed {tc.seed}: {result['timesteps']} decisions trained in {result['train_s']:.0f} s "
        f"({result['steps_per_s']:.0f}/s, {tc.threads} torch thread(s)); {rounds} **test** rounds (seed {tc.eval.seed}; the policy trained on the train "
        f"stream and was chosen on {tc.eval.rounds} validation rounds). `diff_vs_balance`: mean per-round difference in served fraction to "
        "BALANCE on the same rounds, bootstrap 95 % CI, Wilcoxon signed-rank p. One training seed: for a claim, use "
        "`python -m agents.train -m experiment=quick seed=0,1,2,3,4` and `python -m experiments.aggregate`. "
        "Reproduce: `bash scripts/main.sh --publish`.", "",
    ])
    write_text_atomic(path, text)
    return path


if __name__ == "__main__":
    main()
