"""Combine a Hydra multirun (one folder per training seed / config) into one table and one plot.

    python -m experiments.aggregate multirun/train/2026-01-01_12-00-00 [--out DIR] [--test-rounds 500]

Each run folder is one ``agents.train`` run: ``policy.json`` (seed, round streams), ``eval.csv``
(the policy and BALANCE on the same **test** rounds), ``progress.csv`` (validation learning curve)
and ``.hydra/overrides.yaml``. Runs whose overrides differ only in ``seed`` form one group, named
by the overrides that differ between groups (``all`` when only the seed varies).

Writes ``aggregate.csv`` (one row per run, then one ``mean`` row per group), ``aggregate.md`` and
``aggregate.png`` (served / BALANCE per seed with the across-seed mean and 95 % CI; validation
learning curves per seed and their mean) into ``--out`` (default: the multirun folder), atomically.

Per run: served / BALANCE and the paired per-round difference to BALANCE (bootstrap 95 % CI,
Wilcoxon signed-rank; ``agents.paired_stats``). Across seeds: the mean and its Student-t 95 % CI
(seeds are the independent replicates of a training recipe).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import yaml  # noqa: E402

from agents.artefacts import save_figure_atomic, write_csv_atomic, write_text_atomic  # noqa: E402
from agents.evaluate import summarize  # noqa: E402
from agents.paired_stats import t_interval  # noqa: E402

REFERENCE = "balance"
TEST_SEED = 1000003  #: agents.train's default eval.seed, for runs whose policy.json predates the streams
class RunFolderError(ValueError):
    """A run folder's file that cannot be read (corrupt CSV or JSON); the message names the file."""


def read_json(path: Path) -> dict:
    """``path`` parsed as a JSON object, or :class:`RunFolderError` naming it."""
    try:
        meta = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise RunFolderError(f"{path}: not a readable JSON file ({err})") from None
    if not isinstance(meta, dict):
        raise RunFolderError(f"{path}: must hold a JSON object, got {type(meta).__name__}")
    return meta


def read_csv(path: Path) -> pd.DataFrame:
    """``path`` read by pandas, or :class:`RunFolderError` naming it (pandas' own errors do not)."""
    try:
        return pd.read_csv(path)
    except (OSError, UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as err:
        raise RunFolderError(f"{path}: not a readable CSV file ({type(err).__name__}: {err})") from None


RUN_COLS = ["group", "seed", "run", "test_rounds", "served_frac", "balance_served_frac", "ratio_to_balance", "diff_vs_balance", "diff_ci95_low", "diff_ci95_high", "p_wilcoxon", "best_validation_ratio", "timesteps"]


def find_runs(folder: Path) -> list[Path]:
    """Training run folders under ``folder`` (itself, or its subfolders), sorted by seed then name."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"runs folder {folder} does not exist")
    if (folder / "policy.json").is_file():
        return [folder]
    runs = [p for p in folder.iterdir() if p.is_dir() and (p / "policy.json").is_file() and (p / "model.zip").is_file()]
    if not runs:
        raise FileNotFoundError(f"no training runs (folders with policy.json and model.zip) under {folder}")
    return sorted(runs, key=lambda p: (run_seed(p), p.name))


def run_seed(run: Path) -> int:
    return int(read_json(run / "policy.json").get("seed", -1))


def run_overrides(run: Path) -> dict[str, str]:
    """The run's Hydra command-line overrides (``.hydra/overrides.yaml``) as key -> value, without ``seed``."""
    path = run / ".hydra" / "overrides.yaml"
    try:
        items = yaml.safe_load(path.read_text()) if path.is_file() else []
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise RunFolderError(f"{path}: not a readable YAML file ({err})") from None
    if items is not None and not isinstance(items, list):
        raise RunFolderError(f"{path}: must hold a list of overrides, got {type(items).__name__}")
    pairs = (str(o).split("=", 1) for o in items or [])
    return {k.lstrip("+~"): v for k, v in ((p[0], p[1] if len(p) > 1 else "") for p in pairs) if k.lstrip("+~") != "seed"}


def group_labels(runs: list[Path]) -> tuple[list[str], dict[str, str]]:
    """Each run's group (the overrides that differ between runs, ``all`` if none) and the overrides all share."""
    ovs = [run_overrides(r) for r in runs]
    keys = sorted(set().union(*ovs)) if ovs else []
    varying = [k for k in keys if len({o.get(k) for o in ovs}) > 1]
    common = {k: ovs[0][k] for k in keys if k not in varying}
    labels = [" ".join(f"{k}={o.get(k, '-')}" for k in varying) or "all" for o in ovs]
    return labels, common


def learning_curve(run: Path) -> pd.DataFrame:
    """Validation evaluations of one run: ``timesteps``, ``ratio_to_balance``."""
    path = run / "progress.csv"
    cols = ["time/total_timesteps", "eval/ratio_to_balance"]
    if not path.is_file():
        return pd.DataFrame(columns=["timesteps", "ratio_to_balance"])
    prog = read_csv(path)
    if not set(cols) <= set(prog.columns):
        return pd.DataFrame(columns=["timesteps", "ratio_to_balance"])
    curve = prog.dropna(subset=cols)[cols].drop_duplicates(subset=[cols[0]], keep="last").sort_values(cols[0])
    return curve.set_axis(["timesteps", "ratio_to_balance"], axis=1).reset_index(drop=True)


def run_row(run: Path, evaluation: pd.DataFrame | None = None, policy: str = "policy", group: str = "all") -> dict:
    """One run's test-stream comparison with BALANCE (from ``eval.csv`` unless ``evaluation`` is given)."""
    meta = read_json(run / "policy.json")
    row: dict = {"group": group, "seed": int(meta.get("seed", -1)), "run": run.name}
    curve = learning_curve(run)
    row["best_validation_ratio"] = float(curve.ratio_to_balance.max()) if len(curve) else np.nan
    row["timesteps"] = int(curve.timesteps.max()) if len(curve) else np.nan
    df = evaluation if evaluation is not None else (read_csv(run / "eval.csv") if (run / "eval.csv").is_file() else None)
    need = {"scheduler", "round", "served", "num_users"}  # what agents.evaluate.summarize reads
    if df is not None and not need <= set(df.columns):
        raise RunFolderError(f"{run / 'eval.csv'}: needs the columns {sorted(need)} (agents.evaluate's CSV), got {list(df.columns)[:8]}")
    if df is None or not {policy, REFERENCE} <= set(df.scheduler):
        return row
    s = summarize(df[df.scheduler.isin([policy, REFERENCE])], reference=REFERENCE).set_index("scheduler")
    p, b = s.loc[policy], s.loc[REFERENCE]
    row.update(test_rounds=int(p["rounds"]), served_frac=p.served_frac, balance_served_frac=b.served_frac, ratio_to_balance=p.ratio_to_balance)
    row.update({k: p[k] for k in ("diff_vs_balance", "diff_ci95_low", "diff_ci95_high", "p_wilcoxon")})
    return row


def across_seeds(rows: pd.DataFrame) -> pd.DataFrame:
    """Per group: mean and Student-t 95 % CI half-width across seeds, and how many seeds beat BALANCE."""
    out = []
    for group, g in rows.groupby("group", sort=False):
        rec = {"group": group, "seeds": int(g.seed.nunique())}
        for col in ("served_frac", "ratio_to_balance", "diff_vs_balance", "best_validation_ratio"):
            if col in g:
                rec[col], rec[f"{col}_ci95"] = t_interval(g[col].to_numpy(dtype=float))
        if "diff_ci95_low" in g:
            rec["seeds_above_balance"] = int((g.diff_ci95_low > 0).sum())  # paired CI entirely above 0
            rec["seeds_below_balance"] = int((g.diff_ci95_high < 0).sum())
        out.append(rec)
    return pd.DataFrame(out)


def plot(rows: pd.DataFrame, curves: dict[str, list[tuple[int, pd.DataFrame]]], path: Path) -> Path:
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    for gi, (group, g) in enumerate(rows.groupby("group", sort=False)):
        vals = g.ratio_to_balance.to_numpy(dtype=float) if "ratio_to_balance" in g else np.array([])
        ax1.scatter(np.full(len(vals), gi), vals, color="#4c72b0", alpha=0.6, zorder=3, label="seed" if gi == 0 else None)
        m, h = t_interval(vals)
        if np.isfinite(m):
            ax1.errorbar([gi + 0.15], [m], yerr=[h if np.isfinite(h) else 0], fmt="o", color="black", capsize=4, label="mean ± 95 % CI" if gi == 0 else None)
        for seed, curve in curves.get(group, []):
            ax2.plot(curve.timesteps, curve.ratio_to_balance, lw=0.8, alpha=0.5, label=f"{group[:30]} s{seed}" if len(curves) == 1 else None)
        stacked = [c.set_index("timesteps").ratio_to_balance for _, c in curves.get(group, [])]
        if stacked:
            mean = pd.concat(stacked, axis=1).dropna().mean(axis=1)  # timesteps every seed evaluated at
            ax2.plot(mean.index, mean.to_numpy(), lw=2, label=f"mean {group[:30]}")
    ax1.axhline(1.0, color="grey", ls="--")
    groups = list(dict.fromkeys(rows.group))
    ax1.set_xticks(range(len(groups)), [g[:28] for g in groups], rotation=15, fontsize=7)
    ax1.set_xlim(-0.5, len(groups) - 0.5)
    ax1.set_ylabel("served / BALANCE (test rounds)")
    ax1.legend(fontsize=7)
    ax2.axhline(1.0, color="grey", ls="--")
    ax2.set_xlabel("decisions (timesteps)")
    ax2.set_ylabel("served / BALANCE (validation)")
    if ax2.lines:
        ax2.legend(fontsize=6)
    fig.tight_layout()
    return save_figure_atomic(fig, path)


def markdown(rows: pd.DataFrame, means: pd.DataFrame) -> str:
    cols = [c for c in RUN_COLS if c in rows]
    return "\n".join([
        "Per training seed (test rounds; paired difference = policy − BALANCE served fraction per round, "
        "bootstrap 95 % CI, Wilcoxon signed-rank p):", "",
        rows[cols].to_markdown(index=False, floatfmt=".4g"), "",
        "Across seeds (mean, Student-t 95 % CI half-width):", "",
        means.to_markdown(index=False, floatfmt=".4g"), "",
    ])


def evaluate_runs(runs: list[Path], rounds: int, progress: bool = True) -> dict[Path, pd.DataFrame]:
    """Each run's policy and BALANCE on ``rounds`` test rounds of the run's test seed (BALANCE once per setting)."""
    from agents.evaluate import evaluate_schedulers
    from envs.config import EnvConfig
    from envs.workload import make_rounds

    balance: dict[str, pd.DataFrame] = {}
    out = {}
    for run in runs:
        meta = read_json(run / "policy.json")
        seed = int(meta.get("streams", {}).get("test", {}).get("seed", TEST_SEED))
        try:
            cfg = EnvConfig.from_kwargs(**meta["env"])
        except (KeyError, TypeError, ValueError) as err:  # ConfigError is a ValueError
            raise RunFolderError(f"{run / 'policy.json'}: no usable 'env' section to evaluate it on ({type(err).__name__}: {err})") from None
        key = json.dumps([meta["env"], seed], sort_keys=True)
        rnds = make_rounds(cfg, rounds, seed, split="test")
        if key not in balance:
            balance[key] = evaluate_schedulers(cfg, [REFERENCE], rounds=rnds, seed=seed, progress=progress)
        pol = evaluate_schedulers(cfg, ["policy"], rounds=rnds, seed=seed, progress=progress, policy_path=str(run))
        out[run] = pd.concat([balance[key], pol], ignore_index=True)
    return out


def aggregate(folder: Path, out: Path | None = None, test_rounds: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Read every run under ``folder``; write ``aggregate.{csv,md,png}`` into ``out`` (default ``folder``).

    ``test_rounds > 0`` evaluates each policy against BALANCE on that many test rounds here (for runs
    trained with ``eval.final_rounds=0``; their folders are not modified) instead of reading ``eval.csv``.
    """
    runs = find_runs(folder)
    out = Path(out) if out else Path(folder)
    labels, common = group_labels(runs)
    evals = evaluate_runs(runs, test_rounds) if test_rounds > 0 else {}
    # every run is read before anything is written: a corrupt file leaves no half-made aggregate
    rows = pd.DataFrame([run_row(r, evaluation=evals.get(r), group=g) for r, g in zip(runs, labels, strict=True)])
    out.mkdir(parents=True, exist_ok=True)
    if evals:
        write_csv_atomic(pd.concat([df.assign(run=r.name) for r, df in evals.items()], ignore_index=True), out / "aggregate_eval.csv")
    means = across_seeds(rows)
    curves: dict[str, list[tuple[int, pd.DataFrame]]] = {}
    for r, (_, row) in zip(runs, rows.iterrows(), strict=True):
        c = learning_curve(r)
        if len(c):
            curves.setdefault(row.group, []).append((int(row.seed), c))
    table = pd.concat([rows, means.assign(run="mean")], ignore_index=True)
    write_csv_atomic(table, out / "aggregate.csv")
    shared = " ".join(f"{k}={v}" for k, v in common.items()) or "none"
    write_text_atomic(out / "aggregate.md", f"# {len(runs)} runs in `{folder}`\n\nOverrides shared by every run: `{shared}`.\n\n" + markdown(rows, means))
    plot(rows, curves, out / "aggregate.png")
    return rows, means


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path, help="a Hydra multirun folder (one subfolder per run) or one run folder")
    ap.add_argument("--out", type=Path, default=None, help="where aggregate.{csv,md,png} go (default: FOLDER)")
    ap.add_argument("--test-rounds", type=int, default=0, help="evaluate every policy vs BALANCE on this many test rounds here (runs trained with eval.final_rounds=0); 0 = read each run's eval.csv")
    args = ap.parse_args(argv)
    if args.test_rounds < 0:
        ap.error(f"--test-rounds must be >= 0, got {args.test_rounds}")
    try:
        rows, means = aggregate(args.folder, args.out, test_rounds=args.test_rounds)
    except (FileNotFoundError, RunFolderError) as err:
        raise SystemExit(f"experiments.aggregate: error: {err}") from None
    print(markdown(rows, means))
    print(f"wrote {(args.out or args.folder) / 'aggregate.csv'}, .md, .png")


if __name__ == "__main__":
    main()
