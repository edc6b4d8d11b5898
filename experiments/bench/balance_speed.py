"""BALANCE's decision time per round (median over rounds), against AD-only in the same process.

    python -m experiments.bench.balance_speed [--ks 12,50,70,200] [--rounds 10] [--out results/balance_speed.md]

Targets (issue #3, kept by issue #10's exact SD solve): K = 70 in <= 0.1 s median on an idle
machine, K = 200 in <= 2 s. The ratio to AD-only (one per-mode solve at z = lambda = 1) is printed
because absolute times move with the machine's load; the 1-minute load average at the start and
end of the run is written beside the table so a reader can tell an idle run from a shared one.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
import pandas as pd

from agents.artefacts import write_text_atomic
from agents.registry import make_scheduler
from envs.config import EnvConfig
from envs.cost_model import CostModel
from envs.workload import make_rounds


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ks", default="12,50,70,200")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    ks = [int(v) for v in args.ks.split(",")]
    if not ks or min(ks) < 1:
        raise SystemExit(f"--ks must list integers >= 1, got {args.ks!r}")
    if args.rounds < 1:
        raise SystemExit(f"--rounds must be >= 1, got {args.rounds}")
    load_start = os.getloadavg()[0]
    rows = []
    for k in ks:
        cfg = EnvConfig(num_users=k)
        cost = CostModel.from_config(cfg)
        rounds = make_rounds(cfg, args.rounds, 0)
        times = {}
        for name in ("balance", "ad_only"):
            sched = make_scheduler(name, cost, cfg.max_gamma)
            t = []
            for rnd in rounds:
                start = time.perf_counter()
                sched.plan(rnd)
                t.append(time.perf_counter() - start)
            times[name] = float(np.median(t))
        rows.append({"K": k, "rounds": args.rounds, "BALANCE median (s)": times["balance"], "AD-only median (s)": times["ad_only"], "BALANCE / AD-only": times["balance"] / times["ad_only"]})
    text = pd.DataFrame(rows).to_markdown(index=False, floatfmt=".3g")
    cpus = os.cpu_count()
    load = f"1-minute load average {load_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end ({cpus} CPUs)"
    print(text + "\n\n" + load)
    if args.out:
        # never leave a half-written table behind
        write_text_atomic(args.out, text + f"\n\n{load}.\n\nReproduce: `python -m experiments.bench.balance_speed --ks {args.ks} --rounds {args.rounds}`\n")


if __name__ == "__main__":
    main()
