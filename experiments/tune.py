"""Did tuning help? The tuned config against the default one, on the TEST stream (issue 15 §2).

    python -m experiments.tune --seeds 1,2,3            # train both configs per seed, then compare (~15 min on a busy 2-core host)
    python -m experiments.tune --seeds 1,2,3 --reuse    # compare already trained runs in --runs
    python -m experiments.tune --seeds 1,2,3 --timesteps 10000   # both at a quarter of the budget: compare_t10000.*

For every training seed, ``agents.train`` trains the **default** configuration (conf/agent/
maskable_ppo.yaml's hyperparameters on the search's ``setting``, conf/tune/search.yaml) and the
**tuned** one (``experiment=tuned_k20``, written by ``python -m agents.tune``) with the same budget
and the same run-only overrides; ``model.zip`` of each is chosen on the validation stream as
usual. Seeds default to 1, 2, 3 -- not the search's training seed 0 -- so the comparison is not
made on the run the selection was made on. Both policies and BALANCE then plan the same
``--rounds`` rounds of the **test** stream (seed 1000003, never seen by the search).

Writes ``results/tune/compare.md``, ``compare.csv`` (per seed and pooled: served fraction of each
config, ratio to BALANCE, the paired per-round difference tuned - default with its bootstrap 95 %
CI and Wilcoxon p-value from ``agents.paired_stats``; across seeds the Student-t CI of the
per-seed differences) and ``compare_rows.csv`` (one row per scheduler, seed and round).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd

from agents.artefacts import write_csv_atomic, write_text_atomic
from agents.evaluate import evaluate_schedulers
from agents.paired_stats import paired_difference, t_interval
from agents.threads import limit_threads
from agents.train import TrainConfig, train
from agents.tune import load_search_config, train_config
from envs.workload import make_rounds

ROOT = Path(__file__).resolve().parent.parent
SEED = 1000003  #: the test stream's seed (agents.train's eval.seed; validation is a disjoint stream of it)
CONFIGS = ("default", "tuned")


def _train_or_reuse(raw: dict, out: Path, reuse: bool) -> Path:
    if reuse and (out / "model.zip").is_file() and (out / "policy.json").is_file():
        print(f"[compare] reusing {out}", flush=True)
        return out
    start = time.perf_counter()
    train(raw, out)
    print(f"[compare] trained {out} in {time.perf_counter() - start:.0f} s", flush=True)
    return out


def compare(seeds: list[int], rounds: int, experiment: str, runs: Path, reuse: bool, search_overrides: list[str] | None = None, timesteps: int | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per-round rows, summary) of default vs tuned for every seed on ``rounds`` test rounds
    (``timesteps``: both configs trained this many timesteps instead of the setting's)."""
    cfg = load_search_config(search_overrides or [])
    env = None
    folders: dict[tuple[str, int], Path] = {}
    for seed in seeds:
        for name in CONFIGS:
            raw = train_config(cfg, seed, experiment if name == "tuned" else None)
            if timesteps is not None:
                raw["total_timesteps"] = timesteps
            this_env = TrainConfig.from_dict(raw).env
            if env is not None and this_env != env:
                raise ValueError(f"the {name} config trains on another environment than the default: {this_env} vs {env}")
            env = this_env
            folders[(name, seed)] = _train_or_reuse(raw, runs / f"{name}_s{seed}", reuse)
    test_rounds = make_rounds(env, rounds, SEED, split="test")
    parts = [evaluate_schedulers(env, ["balance"], rounds=test_rounds, seed=SEED).assign(seed=-1)]
    for (name, seed), folder in folders.items():
        df = evaluate_schedulers(env, ["policy"], rounds=test_rounds, seed=SEED, policy_path=str(folder))
        parts.append(df.assign(scheduler=name, seed=seed))
    rows = pd.concat(parts, ignore_index=True)
    return rows, summarize(rows, env.num_users)


def summarize(rows: pd.DataFrame, num_users: int) -> pd.DataFrame:
    balance = rows[rows.scheduler == "balance"].sort_values("round").served.to_numpy(dtype=float)
    served = {(n, s): g.sort_values("round").served.to_numpy(dtype=float) for (n, s), g in rows[rows.scheduler != "balance"].groupby(["scheduler", "seed"])}
    seeds = sorted({s for _, s in served})
    out = []
    for label, pick in [*((f"seed {s}", [s]) for s in seeds), (f"pooled ({len(seeds)} seeds, per-round mean)", seeds)]:
        d = np.mean([served[("default", s)] for s in pick], axis=0)
        t = np.mean([served[("tuned", s)] for s in pick], axis=0)
        diff = paired_difference(t / num_users, d / num_users)
        out.append(
            {
                "row": label,
                "rounds": len(d),
                "default_served_frac": d.mean() / num_users,
                "tuned_served_frac": t.mean() / num_users,
                "default_ratio_to_balance": d.mean() / balance.mean(),
                "tuned_ratio_to_balance": t.mean() / balance.mean(),
                "diff_tuned_minus_default": diff.mean,
                "diff_ci95_low": diff.ci_low,
                "diff_ci95_high": diff.ci_high,
                "p_wilcoxon": diff.p_value,
            }
        )
    per_seed = np.array([r["diff_tuned_minus_default"] for r in out[: len(seeds)]])
    mean, half = t_interval(per_seed)
    out.append({"row": f"across seeds (Student-t over {len(seeds)} per-seed differences)", "rounds": len(balance), "diff_tuned_minus_default": mean, "diff_ci95_low": mean - half, "diff_ci95_high": mean + half})
    table = pd.DataFrame(out)
    table.attrs["balance_served_frac"] = balance.mean() / num_users
    return table


def markdown(table: pd.DataFrame, seeds: list[int], rounds: int, experiment: str, wall_s: float, timesteps: int | None = None) -> str:
    fmt = lambda v, p=4: "" if pd.isna(v) else f"{v:.{p}f}"  # noqa: E731
    lines = [
        "# Tuned vs default MaskablePPO on the test stream" + (f", both trained {timesteps:,} timesteps" if timesteps else ""),
        "",
        f"Written by `python -m experiments.tune --seeds {','.join(map(str, seeds))} --rounds {rounds}{f' --timesteps {timesteps}' if timesteps else ''}` (experiments/tune.py) in {wall_s / 60:.1f} min (one torch thread, shared 2-core host).",
        f"Both configs trained per seed with the search's setting (conf/tune/search.yaml){'' if not timesteps else f' but {timesteps:,} timesteps'}; tuned = `experiment={experiment}`.",
        f"Test stream: {rounds} rounds of seed {SEED}; BALANCE serves {table.attrs['balance_served_frac']:.4f} of the users on them.",
        "Difference: tuned - default served fraction, paired per round (bootstrap 95 % CI, Wilcoxon signed-rank).",
        "",
        "| row | default | tuned | default / BALANCE | tuned / BALANCE | tuned - default | 95 % CI | p |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in table.itertuples():
        lines.append(
            f"| {r.row} | {fmt(r.default_served_frac)} | {fmt(r.tuned_served_frac)} | {fmt(r.default_ratio_to_balance, 3)} | {fmt(r.tuned_ratio_to_balance, 3)} "
            f"| {r.diff_tuned_minus_default:+.4f} | [{r.diff_ci95_low:+.4f}, {r.diff_ci95_high:+.4f}] | {fmt(r.p_wilcoxon, 3)} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> pd.DataFrame:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="1,2,3", help="training seeds, comma-separated")
    ap.add_argument("--rounds", type=int, default=500, help="test rounds")
    ap.add_argument("--experiment", default="tuned_k20", help="the tuned config: NAME of conf/experiment/NAME.yaml, or a path to a .yaml")
    ap.add_argument("--search-set", nargs="*", default=[], metavar="KEY=VALUE", help="overrides of conf/tune/search.yaml (the default config's setting; for smoke tests)")
    ap.add_argument("--runs", type=Path, default=Path("runs/tune/compare"), help="training run folders")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "tune")
    ap.add_argument("--timesteps", type=int, default=None, help="train both configs this many timesteps (default: the setting's); outputs get a _tN suffix")
    ap.add_argument("--reuse", action="store_true", help="skip training where a run folder already holds model.zip")
    args = ap.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    if not seeds or args.rounds < 1 or (args.timesteps is not None and args.timesteps < 1):
        raise SystemExit("--seeds needs at least one seed, --rounds and --timesteps must be >= 1")
    tag = f"_t{args.timesteps}" if args.timesteps else ""
    runs = args.runs.with_name(args.runs.name + tag)
    limit_threads(1)
    start = time.perf_counter()
    rows, table = compare(seeds, args.rounds, args.experiment, runs, args.reuse, args.search_set, args.timesteps)
    write_csv_atomic(rows, args.out / f"compare{tag}_rows.csv")
    write_csv_atomic(table, args.out / f"compare{tag}.csv")
    text = markdown(table, seeds, args.rounds, args.experiment, time.perf_counter() - start, args.timesteps)
    write_text_atomic(args.out / f"compare{tag}.md", text)
    print(text)
    return table


if __name__ == "__main__":
    main()
