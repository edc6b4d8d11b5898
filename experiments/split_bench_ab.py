"""Paired A/B of two checkouts of this repository on the split benchmark: each configuration runs
``experiments.split_bench`` once from checkout A, then at once from checkout B, and again for every
repeat, so host drift (this project's shared 2-core hosts vary by tens of percent over minutes)
falls on both sides alike.

    git worktree add /tmp/before <commit>
    python -m experiments.split_bench_ab --a /tmp/before --b . --out /tmp/ab --clients 8,16,32 --repeats 2

or of one checkout with and without a switch (``--a-args`` / ``--b-args``: extra
``experiments.split_bench`` arguments for that side only):

    python -m experiments.split_bench_ab --a . --b . --b-args="--depth-probe cheaper" --out /tmp/ab

Writes ``DIR/ab.csv`` (one row per run) and ``DIR/ab.md``: per configuration the mean ITL of each
side, B / A, and per side proactive on vs off (the issue's ">= 5 % lower ITL" check). Every run
reuses one server-only baseline (``--baseline``; the ITLs do not depend on it).
"""

from __future__ import annotations

import argparse
import itertools
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from agents.artefacts import require_writable, write_csv_atomic, write_text_atomic

ROOT = Path(__file__).resolve().parents[1]


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", type=Path, required=True, help="checkout A (e.g. a git worktree of the older commit)")
    ap.add_argument("--b", type=Path, required=True, help="checkout B")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--clients", type=_ints, default=[8, 16, 32])
    ap.add_argument("--proactive", default="on,off")
    ap.add_argument("--cohorts", type=_ints, default=[1, 2])
    ap.add_argument("--rtt-ms", type=float, default=5.0)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--baseline", type=Path, default=ROOT / "results" / "split_bench" / "baseline.csv")
    ap.add_argument("--preset", default="full", help="the project's pair (experiments.split_bench --preset)")
    ap.add_argument("--requests", type=int, default=2, help="requests per client (experiments.split_bench --requests)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--a-args", default="", help="extra experiments.split_bench arguments for side A only, one string (write --a-args='--x y': "
                                                 "a value starting with -- needs the =)")
    ap.add_argument("--b-args", default="", help="extra experiments.split_bench arguments for side B only (as --a-args)")
    args = ap.parse_args(argv)
    try:
        args.extra = {"a": shlex.split(args.a_args), "b": shlex.split(args.b_args)}
    except ValueError as exc:
        raise SystemExit(f"--a-args / --b-args: {exc}") from None
    args.proactive = [p for p in args.proactive.split(",") if p]
    for side in (args.a, args.b):
        if not (side / "experiments" / "split_bench.py").is_file():
            raise SystemExit(f"--a/--b must be checkouts of this repository, {side} has no experiments/split_bench.py")
    if not set(args.proactive) <= {"on", "off"} or not args.proactive or not args.clients or min(args.clients) < 1 or args.repeats < 1:
        raise SystemExit("--proactive takes on/off, --clients counts >= 1, --repeats >= 1")
    if not args.baseline.is_file():
        raise SystemExit(f"--baseline {args.baseline} is not a file (run experiments.split_bench once first)")
    require_writable(args.out, "--out", directory=True)
    args.out = args.out.resolve()  # each run's split_bench works in its checkout: a relative --out would land there
    return args


def run_one(side: Path, out: Path, args, clients: int, proactive: str, cohorts: int, extra: Sequence[str] = ()) -> dict:
    cmd = [sys.executable, "-m", "experiments.split_bench", "--out", str(out), "--rtt-ms", f"{args.rtt_ms:g}", "--clients", str(clients),
           "--proactive", proactive, "--cohorts", str(cohorts), "--baseline", str(args.baseline.resolve()), "--preset", args.preset,
           "--requests", str(args.requests), "--max-new-tokens", str(args.max_new_tokens), *extra]
    done = subprocess.run(cmd, cwd=side, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"split_bench failed in {side} ({done.returncode}): {done.stderr[-1500:]}")
    return pd.read_csv(out / "split_bench.csv").iloc[0].to_dict()


def _with(extra: list[str]) -> str:
    return f"; with `{shlex.join(extra)}`" if extra else ""


def describe_checkout(side: Path) -> str:
    """``<commit>`` of a checkout, ``+ uncommitted changes`` when its tracked files differ from it."""
    def git(*cmd: str) -> str:
        done = subprocess.run(["git", "-C", str(side), *cmd], capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    commit = git("rev-parse", "--short", "HEAD") or "not a git checkout"
    return commit + (" + uncommitted changes" if git("status", "--porcelain", "--untracked-files=no") else "")


def summarise(df: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """Mean ITL per configuration and side with B / A, and per side proactive on vs off."""
    mean = df.groupby(["clients", "proactive", "cohorts", "side"]).itl_ms.mean().unstack("side")
    table = mean.rename(columns={"a": "itl_ms_a", "b": "itl_ms_b"}).assign(b_over_a=lambda t: t.itl_ms_b / t.itl_ms_a).reset_index()
    lines = []
    for side in ("a", "b"):
        by = mean[side].unstack("proactive")
        if not {"on", "off"} <= set(by.columns):
            continue
        for (clients, cohorts), row in by.iterrows():
            on, off = row["on"], row["off"]
            lines.append(f"- {side}, {clients} clients, {cohorts} cohort(s): proactive on vs off ITL {on:.2f} vs {off:.2f} ms, "
                         f"{100 * (1 - on / off):+.1f} % lower (target >= 5 %)")
    return table, lines


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    grid = list(itertools.product(range(args.repeats), args.clients, args.proactive, args.cohorts))
    rows = []
    for k, (rep, clients, proactive, cohorts) in enumerate(grid, 1):
        for name, side in (("a", args.a), ("b", args.b)):
            t0 = time.perf_counter()
            run = run_one(side, args.out / name / f"n{clients}_p{proactive}_c{cohorts}_r{rep}", args, clients, proactive, cohorts, args.extra[name])
            rows.append({"side": name, "repeat": rep, "clients": clients, "proactive": proactive, "cohorts": cohorts,
                         **{c: run.get(c) for c in ("itl_ms", "server_utilisation", "mean_batch", "proactive_hit_rate", "draft_ms",
                                                      "device_wait_ms", "network_ms", "queue_wait_ms", "throughput_ratio", "host_load_1min")}})
            print(f"[split_bench_ab] {k}/{len(grid)} {name}: {clients} clients, proactive {proactive}, cohorts {cohorts}, repeat {rep}: "
                  f"ITL {rows[-1]['itl_ms']:.2f} ms ({time.perf_counter() - t0:.0f} s)", flush=True)
    df = pd.DataFrame(rows)
    write_csv_atomic(df, args.out / "ab.csv", index=False)
    table, lines = summarise(df)
    cmd = "python -m experiments.split_bench_ab " + shlex.join(argv if argv is not None else sys.argv[1:])  # quoted: --b-args "..." reruns as given
    md = ["# Paired A/B of two checkouts on the split benchmark", "", f"Command: `{cmd}`", "",
          f"A: `{args.a}` ({describe_checkout(args.a)}{_with(args.extra['a'])}), B: `{args.b}` ({describe_checkout(args.b)}{_with(args.extra['b'])}); RTT {args.rtt_ms:g} ms; {args.repeats} repeat(s), each configuration run from A then B at once; "
          "mean ITL over the repeats (`ab.csv` has every run).", "", table.to_markdown(index=False, floatfmt=".3g"), "", *lines, ""]
    write_text_atomic(args.out / "ab.md", "\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    main()
