"""Reproduce the BALANCE paper's evaluation (arXiv 2608.05926, Figs. 6-13) on SpecSched's model.

    python -m experiments.paper                       # every study, 50 rounds per point
    python -m experiments.paper --only k,deadline --rounds 100
    python -m experiments.paper --list

Each study writes ``results/<study>.csv`` (one row per point, scheduler and round),
``results/<study>.md`` (served fraction per point, BALANCE's gains -- relative and in percentage
points -- beside the paper's reported numbers) and ``results/<study>.png``. The paper's numbers
come from ``shared/reference/balance.md`` §4; the paper does not say whether its "X % higher" is
relative or in points, so both are shown.

The rounds are rounds ``0..n-1`` of the **test** stream (``envs.workload.make_rounds``, split
``test``) and every scheduler plans the same rounds, so each table also gives BALANCE's **paired**
difference to each baseline (``agents.paired_stats``): per point, the mean per-round difference in
served fraction (percentage points) with its bootstrap 95 % CI and the Wilcoxon signed-rank p; over
the sweep, the same on each round index's across-point mean difference (round ``r`` is drawn from the
same seed at every point, so its points are not independent: the round index is the resampling unit).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from tqdm import tqdm  # noqa: E402

from agents.artefacts import (  # noqa: E402
    require_writable,
    save_figure_atomic,
    write_csv_atomic,
    write_text_atomic,
)
from agents.evaluate import evaluate_schedulers  # noqa: E402
from agents.paired_stats import paired_difference  # noqa: E402
from envs.config import EnvConfig  # noqa: E402
from envs.workload import make_rounds  # noqa: E402

RESULTS = Path(__file__).resolve().parent.parent / "results"
GIB = 1024**3
MAIN = ["balance", "ad_only", "sd_only"]
ABLATION = ["balance", "ecra", "ema", "ecrma"]


@dataclass
class Study:
    name: str
    title: str
    axis: str  #: x-axis label
    values: list
    to_env: Callable[[object], dict]  #: sweep value -> env overrides
    schedulers: list[str] = field(default_factory=lambda: list(MAIN))
    gamma: Callable[[object], int] = lambda v: 4
    paper: str = ""  #: the paper's reported numbers for this study
    base: dict = field(default_factory=dict)  #: env overrides for every point
    options: dict = field(default_factory=dict)  #: scheduler options (agents.registry.OPTIONS)


STUDIES = {
    s.name: s
    for s in [
        Study("k", "Served fraction vs number of users K (Fig. 6a)", "K", [20, 30, 40, 50, 60, 70], lambda v: {"num_users": v},
              paper="BALANCE +37.9 % vs AD-only, +33.4 % vs SD-only on average; K = 70: 70.4 % served (+30.4 % / +30.2 %)"),
        Study("deadline", "Served fraction vs maximum deadline T_max (Fig. 6b)", "T_max (s)", [1, 3, 5, 7, 9, 11, 13], lambda v: {"deadline_s": [0.5, float(v)]},
              paper="+31.5 % vs AD-only, +27.3 % vs SD-only; T_max = 1 s: 62.9 % served (+22.9 % / +22.5 %)"),
        Study("input", "Served fraction vs maximum input length (Figs. 7/8)", "max input (tokens)", [40, 80, 120, 160, 240, 320], lambda v: {"input_tokens": [1, int(v)]},
              paper="+38.8 % vs AD-only, +23.9 % vs SD-only"),
        Study("output", "Served fraction vs maximum output length (Figs. 7/8)", "max output (tokens)", [40, 80, 120, 160, 240, 320], lambda v: {"output_tokens": [1, int(v)]},
              paper="+30.4 % vs AD-only, +27.3 % vs SD-only"),
        Study("memory", "Served fraction vs GPU memory Q (Figs. 7/8)", "Q (GiB)", [17, 18, 19, 20, 22, 24], lambda v: {"memory_bytes": float(v) * GIB},
              paper="+17.4 % vs AD-only, +35.4 % vs SD-only"),
        Study("alpha", "Served fraction vs maximum acceptance rate (Figs. 7/8)", "max alpha", [0.7, 0.75, 0.8, 0.85, 0.9, 0.95], lambda v: {"alpha": [0.6, float(v)]},
              paper="+23.9 % vs AD-only, +41.3 % vs SD-only"),
        Study("gamma", "Served fraction vs draft depth gamma (Figs. 7/8)", "gamma", [1, 2, 3, 4, 5, 6, 7, 8], lambda v: {}, gamma=lambda v: int(v),
              paper="+24.4 % vs AD-only, +39.3 % vs SD-only"),
        Study("exhaustive", "BALANCE vs exhaustive search, K = 10-16 (Fig. 9)", "K", [10, 12, 14, 16], lambda v: {"num_users": v}, schedulers=["balance", "exhaustive"],
              options={"warm_start": False, "time_limit_s": 600.0},
              paper="BALANCE 0.9 % below exhaustive on average; 5,100x faster on average, 21,800x at K = 16"),
        Study("ablation_k", "BALANCE vs fixed splits over K (Fig. 10)", "K", [20, 30, 40, 50, 60, 70], lambda v: {"num_users": v}, schedulers=ABLATION,
              paper="BALANCE +5.6 % vs ECRA, +18.7 % vs EMA, +23.7 % vs ECRMA"),
        Study("ablation_deadline", "BALANCE vs fixed splits over T_max (Fig. 10)", "T_max (s)", [1, 3, 5, 7, 9, 11, 13], lambda v: {"deadline_s": [0.5, float(v)]}, schedulers=ABLATION,
              paper="BALANCE +9.0 % vs ECRA, +4.9 % vs EMA, +18.4 % vs ECRMA"),
        Study("ablation_memory", "BALANCE vs fixed splits over Q (Fig. 10)", "Q (GiB)", [17, 18, 19, 20, 22, 24], lambda v: {"memory_bytes": float(v) * GIB}, schedulers=ABLATION,
              paper="BALANCE +4.6 % vs ECRA, +15.3 % vs EMA, +19.9 % vs ECRMA"),
        Study("robust_alpha", "Robustness to acceptance prediction error (Fig. 11)", "acceptance CV", [0.0, 0.1, 0.2, 0.3], lambda v: {"alpha_cv": float(v), "simulate_acceptance": True},
              paper="BALANCE drops only 2.8 % / 4.3 % at CV 0.3 (two unnamed conditions)"),
        Study("robust_output", "Robustness to output-length prediction error (Fig. 12)", "output CV", [0.0, 0.1, 0.2, 0.3], lambda v: {"output_cv": float(v)},
              paper="BALANCE drops 3.9 % / 3.6 % at CV 0.3"),
        Study("robust_tail", "Robustness to heavy-tailed output error, CV 0.3 (Fig. 13)", "Student-t dof nu (0 = exact predictions, inf = log-normal)", [0, float("inf"), 10, 5, 3], lambda v: {"output_cv": 0.3 if v else 0.0, "output_tail_nu": None if (np.isinf(v) or v == 0) else float(v)},
              paper="BALANCE drops 3.8 % / 4.7 % at nu = 3"),
    ]
}


def run_study(study: Study, rounds: int, seed: int, base_env: dict, progress: bool = True) -> pd.DataFrame:
    frames = []
    for v in tqdm(study.values, desc=study.name, disable=not progress):
        cfg = EnvConfig.from_kwargs(**{**base_env, **study.base, **study.to_env(v)})
        df = evaluate_schedulers(cfg, study.schedulers, rounds=make_rounds(cfg, rounds, seed, split="test"), seed=seed, draft_depth=study.gamma(v), **study.options)
        frames.append(df.assign(value=v))
    return pd.concat(frames, ignore_index=True)


def gains(table: pd.DataFrame, against: list[str]) -> pd.DataFrame:
    """BALANCE's average gain over each baseline across the sweep: relative and in points."""
    rows = []
    for base in against:
        b, o = table["balance"], table[base]
        rel = ((b - o) / o.where(o > 0)).mean() * 100
        rows.append({"baseline": base, "relative gain (%)": rel, "gain (percentage points)": ((b - o) * 100).mean()})
    return pd.DataFrame(rows)


PAIRED_COLS = ["baseline", "diff_pp", "ci95_low_pp", "ci95_high_pp", "p_wilcoxon", "rounds"]


def _round_fractions(df: pd.DataFrame) -> pd.DataFrame:
    """Served fraction per (value, round) and scheduler (one column per scheduler)."""
    return df.assign(served_frac=df.served / df.num_users).pivot_table(index=["value", "round"], columns="scheduler", values="served_frac", aggfunc="mean")


def _paired_row(baseline: str, a: np.ndarray, b: np.ndarray, seed: int = 0) -> dict:
    d = paired_difference(a, b, seed=seed)
    return {"baseline": baseline, "diff_pp": d.mean * 100, "ci95_low_pp": d.ci_low * 100, "ci95_high_pp": d.ci_high * 100, "p_wilcoxon": d.p_value, "rounds": d.n}


def paired_by_point(df: pd.DataFrame, against: list[str], reference: str = "balance") -> pd.DataFrame:
    """``reference`` - each baseline on the same rounds, per sweep point: mean per-round difference in
    served fraction (percentage points), bootstrap 95 % CI, Wilcoxon signed-rank p (one row per point and baseline)."""
    fr = _round_fractions(df)
    rows = []
    for value, g in fr.groupby(level="value", sort=False):
        for base in against:
            both = g[[reference, base]].dropna()
            rows.append({"value": value, **_paired_row(base, both[reference].to_numpy(), both[base].to_numpy())})
    return pd.DataFrame(rows, columns=["value", *PAIRED_COLS])


def paired_sweep(df: pd.DataFrame, against: list[str], reference: str = "balance") -> pd.DataFrame:
    """``reference`` - each baseline averaged over the sweep, paired by round index.

    Round ``r`` of every point comes from the same seed, so the points of one round index are not
    independent: per round index the across-point mean of the served fraction is taken for both
    schedulers and those means are compared (bootstrap over round indices, Wilcoxon signed-rank).
    With the same rounds at every point the mean equals :func:`gains`' percentage points.
    """
    fr = _round_fractions(df)
    rows = []
    for base in against:
        both = fr[[reference, base]].dropna().groupby(level="round").mean()
        rows.append(_paired_row(base, both[reference].to_numpy(), both[base].to_numpy()))
    return pd.DataFrame(rows, columns=PAIRED_COLS)


def fmt_diff(mean_pp: float, low_pp: float, high_pp: float) -> str:
    """``+7.4 pp [6.9, 7.9]``: a paired difference in percentage points with its 95 % CI."""
    return f"{mean_pp:+.1f} pp [{low_pp:.1f}, {high_pp:.1f}]"


def gain_cells(df: pd.DataFrame, study: Study) -> dict[str, str]:
    """README cells from a study's per-round CSV rows: baseline -> ``+10.7 % (+7.4 pp [6.9, 7.9])``
    (relative gain of the sweep means, then the paired difference in points with its bootstrap 95 % CI)."""
    against = study.schedulers[1:]
    frac = (df.served / df.num_users).groupby([df.value, df.scheduler]).mean().unstack()
    rel = gains(frac, against).set_index("baseline")["relative gain (%)"]
    paired = paired_sweep(df, against, study.schedulers[0]).set_index("baseline")
    return {b: f"{rel[b]:+.1f} % ({fmt_diff(paired.diff_pp[b], paired.ci95_low_pp[b], paired.ci95_high_pp[b])})" for b in against}


def paired_markdown(df: pd.DataFrame, study: Study) -> str:
    """Per point and over the sweep: BALANCE - each baseline, ``+x.x pp [lo, hi]`` and the Wilcoxon p."""
    ref, against = study.schedulers[0], study.schedulers[1:]
    per_point = paired_by_point(df, against, ref)
    sweep = paired_sweep(df, against, ref).assign(value="sweep mean")
    both = pd.concat([per_point, sweep], ignore_index=True)
    order = [*(str(int(v)) if np.isfinite(float(v)) and float(v).is_integer() else str(v) for v in study.values), "sweep mean"]
    both["value"] = [v if isinstance(v, str) else (str(int(v)) if np.isfinite(float(v)) and float(v).is_integer() else str(v)) for v in both.value]
    out = pd.DataFrame(index=[v for v in order if v in set(both.value)])
    for base in against:
        g = both[both.baseline == base].set_index("value")
        out[f"{ref} - {base}"] = [fmt_diff(r.diff_pp, r.ci95_low_pp, r.ci95_high_pp) for r in g.loc[out.index].itertuples()]
        out[f"p (vs {base})"] = [f"{p:.2g}" for p in g.loc[out.index].p_wilcoxon]
    return _md(out, study.axis, ".3g")


def _md(table: pd.DataFrame, axis: str, floatfmt: str) -> str:
    """A sweep table as markdown, the sweep value printed as is (tabulate would float-format ints)."""
    out = table.rename_axis(axis).reset_index()
    out[axis] = [str(v) for v in out[axis]]
    return out.to_markdown(index=False, floatfmt=floatfmt)


def report(study: Study, df: pd.DataFrame, rounds: int, elapsed_s: float, out_dir: Path, seed: int | None = None) -> str:
    df = df.assign(served_frac=df.served / df.num_users)
    table = df.pivot_table(index="value", columns="scheduler", values="served_frac", aggfunc="mean")[study.schedulers]
    table = table.reindex([v for v in study.values if v in table.index])  # the study's own order
    if all(float(v).is_integer() for v in table.index if np.isfinite(float(v))):
        table.index = [int(v) if np.isfinite(float(v)) else v for v in table.index]
    robust = study.name.startswith("robust")
    stream = f"test stream, seed {seed}" if seed is not None else "test stream"
    lines = [f"# {study.title}", "", f"{rounds} rounds per point ({stream}: `envs.workload.make_rounds(..., split=\"test\")`), the same rounds for every scheduler; served fraction (mean).", ""]
    lines += [_md(table, study.axis, ".3f"), ""]
    if study.name == "exhaustive":
        t = df.pivot_table(index="value", columns="scheduler", values="decision_s", aggfunc="median")
        per_round = df.pivot_table(index=["value", "round"], columns="scheduler", values=["served", "decision_s"])
        speed = (per_round["decision_s"]["exhaustive"] / per_round["decision_s"]["balance"]).groupby(level=0).mean()
        comp = pd.DataFrame(
            {
                "gap to optimum (%)": (1 - table["balance"] / table["exhaustive"]) * 100,
                "rounds where BALANCE is optimal": (per_round["served"]["balance"] == per_round["served"]["exhaustive"]).groupby(level=0).mean(),
                "BALANCE median (ms)": t["balance"] * 1e3,
                "exhaustive median (ms)": t["exhaustive"] * 1e3,
                "speed-up (mean of per-round ratios)": speed,
            }
        )
        lines += [_md(comp, study.axis, ".3g"), ""]
        lines += ["Exhaustive = complete level-by-level search with the exact check, cold (no BALANCE incumbent); the paper's exhaustive search enumerates all 3^K assignments, so its speed-ups are larger by construction.", ""]
    elif robust:
        clean = table.iloc[0]
        drop = ((clean - table) / clean * 100).rename(columns=lambda c: f"{c} drop (%)")
        lines += ["Drop against exact predictions (relative, %):", "", _md(drop, study.axis, ".2f"), ""]
    else:
        g = gains(table, study.schedulers[1:]).drop(columns="gain (percentage points)")  # = the paired mean (same rounds at every point)
        g = g.merge(paired_sweep(df, study.schedulers[1:], study.schedulers[0]).drop(columns="rounds"), on="baseline")
        g = g.rename(columns={"diff_pp": "gain (percentage points)", "ci95_low_pp": "95 % CI low (pp)", "ci95_high_pp": "95 % CI high (pp)", "p_wilcoxon": "Wilcoxon p"})
        lines += ["BALANCE's average gain over the sweep (paired: per round index, bootstrap 95 % CI over round indices):", "", g.to_markdown(index=False, floatfmt=".3g"), ""]
    lines += [f"Paired difference {study.schedulers[0]} - baseline on the same test-stream rounds, in percentage points of served fraction "
              "(mean [bootstrap 95 % CI]; Wilcoxon signed-rank p, two-sided; `agents.paired_stats`):", "", paired_markdown(df, study), ""]
    if not np.isfinite(elapsed_s):  # --report-only: keep the timing of the run that made the CSV
        import re

        old = out_dir / f"{study.name}.md"
        m = re.search(r"\((\d+) s here\)", old.read_text()) if old.exists() else None
        elapsed_s = float(m.group(1)) if m else float("nan")
    lines += [f"Paper (balance.md §4): {study.paper}.", "", f"Reproduce: `python -m experiments.paper --only {study.name} --rounds {rounds}` ({elapsed_s:.0f} s here).", ""]
    text = "\n".join(lines)
    write_text_atomic(out_dir / f"{study.name}.md", text)

    fig, ax = plt.subplots(figsize=(5, 3.4))
    x = np.arange(len(table.index)) if robust else table.index.to_numpy(dtype=float)
    for name in study.schedulers:
        ax.plot(x, table[name], marker="o", label=name)
    if robust:
        ax.set_xticks(x, [str(v) for v in table.index])
    ax.set_xlabel(study.axis)
    ax.set_ylabel("served fraction")
    ax.set_title(study.title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    png = out_dir / f"{study.name}.png"
    save_figure_atomic(fig, png)  # a kill never leaves a half-written picture
    return text


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="", help="comma-separated study names (default: all)")
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--report-only", action="store_true", help="rewrite .md/.png from the existing CSVs")
    args = ap.parse_args(argv)
    if args.list:
        for s in STUDIES.values():
            print(f"{s.name:18s} {s.title}")
        return
    names = [n for n in args.only.split(",") if n] or list(STUDIES)
    unknown = sorted(set(names) - set(STUDIES))
    if unknown:
        raise SystemExit(f"unknown study {unknown}; known: {list(STUDIES)}")
    if args.rounds < 1:
        raise SystemExit("--rounds must be >= 1")
    if not 0 <= args.seed < 2**32:
        raise SystemExit(f"--seed must be an integer in [0, 2**32), got {args.seed}")
    require_writable(args.out, "--out", directory=True)
    args.out.mkdir(parents=True, exist_ok=True)
    base_env = EnvConfig().to_dict()
    for name in names:
        study = STUDIES[name]
        start = time.perf_counter()
        if args.report_only:
            df = pd.read_csv(args.out / f"{name}.csv")
            df["value"] = df["value"].astype(float)
            rounds = int(df.groupby(["value", "scheduler"]).size().min())
            print(report(study, df, rounds, float("nan"), args.out, seed=args.seed))
            continue
        df = run_study(study, args.rounds, args.seed, base_env)
        write_csv_atomic(df, args.out / f"{name}.csv")
        print(report(study, df, args.rounds, time.perf_counter() - start, args.out, seed=args.seed))


if __name__ == "__main__":
    main()
