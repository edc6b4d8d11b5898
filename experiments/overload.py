"""Overload: what the live server does as the offered load grows past what it can serve.

    python -m experiments.overload [--scheduler balance] [--users 8,16,32,64] [--rounds 3]

Starts ``runtime.serve`` on loopback (the project's pair, one torch thread, the one-thread
profile) and replays rounds of growing size with ``runtime.loadgen`` (deadlines and outputs scaled
as in ``experiments.sim_vs_real``). Admission control should keep the late count near zero while
the rejected count absorbs the excess, and the served count should level off at what the device
can carry instead of collapsing. Writes ``results/overload.{csv,md}``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from experiments.sim_vs_real import ROOT, free_port, serve
from runtime.loadgen import run as loadgen
from runtime.pair import build_pair

RESULTS = ROOT / "results"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scheduler", default="balance")
    ap.add_argument("--users", default="8,16,32,64", help="requests per round, comma-separated")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--time-scale", type=float, default=0.25)
    ap.add_argument("--token-scale", type=float, default=0.5)
    ap.add_argument("--window-s", type=float, default=0.3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--profile", default="cpu1_specsched-pair")
    ap.add_argument("--pair", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    try:
        loads = [int(u) for u in args.users.split(",")]
    except ValueError:
        raise SystemExit("--users must be comma-separated integers") from None
    if not loads or min(loads) < 1 or max(loads) > 64:
        raise SystemExit("--users must be integers in [1, 64] (the server's max_round)")
    pair = args.pair or build_pair()
    env = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "env" / "paper.yaml"))
    proc, url = serve(args.scheduler, pair, free_port(), args.window_s, 0.9, args.profile, args.threads)
    rows, frames = [], []
    try:
        for users in loads:
            start = time.monotonic()
            df, _ = loadgen({"env": env, "url": url, "rounds": args.rounds, "users": users, "seed": 0, "time_scale": args.time_scale, "token_scale": args.token_scale,
                             "max_tokens_cap": 160, "round_gap_s": 0.0, "output": None, "timeout_s": 600, "stream": True})
            wall = time.monotonic() - start
            frames.append(df.assign(users_per_round=users))
            done = df[df.outcome.isin(["served", "late"])]
            rows.append({
                "requests / round": users, "requests": len(df),
                "served": int((df.outcome == "served").sum()), "late": int((df.outcome == "late").sum()),
                "rejected": int((df.outcome == "rejected").sum()), "errors": int((df.outcome == "error").sum()),
                "served %": float((df.outcome == "served").mean() * 100),
                "late % of admitted": float((df.outcome == "late").sum() / max(len(done), 1) * 100),
                "served / round": float((df.outcome == "served").sum() / args.rounds),
                "p50 latency admitted (s)": float(done.latency_s.median()) if len(done) else np.nan,
                "p99 latency admitted (s)": float(done.latency_s.quantile(0.99)) if len(done) else np.nan,
                "rejection answer p50 (s)": float(df.latency_s[df.outcome == "rejected"].median()) if (df.outcome == "rejected").any() else np.nan,
                "goodput (tokens/s)": float(df.output_tokens[df.outcome == "served"].sum() / wall),
            })
            print(pd.DataFrame(rows[-1:]).to_markdown(index=False, floatfmt=".3g"), flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    table = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    pd.concat(frames, ignore_index=True).to_csv(args.out / "overload.csv", index=False)
    text = "\n".join([
        "# Overload", "",
        f"`{args.scheduler}` on the live server (the project's pair, {args.threads} torch thread(s), profile `{args.profile}`, round window {args.window_s} s); "
        f"{args.rounds} rounds per load, deadlines x {args.time_scale}, outputs x {args.token_scale}. A rejected request is answered when its round is planned.", "",
        table.to_markdown(index=False, floatfmt=".3g"), "",
        f"Reproduce: `python -m experiments.overload --scheduler {args.scheduler} --users {args.users} --rounds {args.rounds}`", "",
    ])
    (args.out / "overload.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
