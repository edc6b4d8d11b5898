"""Overload: what the live server does as the offered load grows past what it can serve.

    python -m experiments.overload [--scheduler balance] [--users 8,16,32,64] [--rounds 3] [--burst 10] [--hog 1]

Starts ``runtime.serve`` on loopback (one torch thread, the one-thread profile) and runs, with
``runtime.loadgen`` (deadlines and outputs scaled as in ``experiments.sim_vs_real``):

- **steady** loads: rounds of growing size, each round sent when the previous one is answered;
- **burst**: ``--burst`` x the largest load at once (every round sent together, e.g. 10 x 64 = 640
  requests);
- **burst + CPU hog**: the same burst with ``--hog`` busy-looping processes beside the server
  (started by this experiment, stopped when the burst is answered, and bounded by ``--hog-max-s``
  whatever happens), so the host is slower than the profile says.

Admission control and the queue's deadline check should keep the late count near zero while the
rejected count absorbs the excess; a rejection should reach the client before its deadline. The
table reports, per run, the share of rejections answered before the request's deadline and the
share of admitted requests (served + late) served on time, plus the server's calibration factors
at the end (``/health``). Latencies are the client's (the load generator's clock, from the moment
it starts sending). Each request carries that moment as its send stamp (``X-Request-Start``), and
the server counts its deadline from there; *server clock* is the server's own latency from that
stamp to its decision, so the gap between the two is the answer's way back (writing it out, the
kernel, the client reading it). *send to server* is the median time from the stamp to the server's
app (connect, the kernel's and uvicorn's queues: under a burst, large); *answer margin* is how early
the server decided rejections at the end (``runtime.admission``). Writes ``results/overload.{csv,md}``.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from agents.artefacts import check_writable, write_csv_atomic, write_text_atomic
from experiments.sim_vs_real import ROOT, free_port, serve
from runtime.loadgen import run as loadgen
from runtime.pair import build_pair
from runtime.serve_config import ServeConfig

RESULTS = ROOT / "results"


class CpuHog:
    """Busy-looping processes beside the server, bounded in time even if this process dies."""

    def __init__(self, procs: int, max_s: float):
        code = f"import time\nend = time.monotonic() + {float(max_s)}\nwhile time.monotonic() < end:\n    pass\n"
        self.procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(procs)]

    def stop(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


def row_for(df: pd.DataFrame, name: str, rounds: int, wall: float, health: dict) -> dict:
    admitted = df[df.outcome.isin(["served", "late"])]
    rejected = df[df.outcome == "rejected"]
    cal = health.get("calibration", {})
    return {
        "run": name, "requests": len(df),
        "served": int((df.outcome == "served").sum()), "late": int((df.outcome == "late").sum()),
        "rejected": int(len(rejected)), "errors": int((df.outcome == "error").sum()),
        "served %": float((df.outcome == "served").mean() * 100),
        "rejections before deadline %": float((rejected.latency_s < rejected.deadline_s).mean() * 100) if len(rejected) else np.nan,
        "same, server clock %": float((pd.to_numeric(rejected.server_latency_s) < rejected.deadline_s).mean() * 100) if len(rejected) else np.nan,
        "admitted on time %": float((admitted.outcome == "served").mean() * 100) if len(admitted) else np.nan,
        "served / round": float((df.outcome == "served").sum() / rounds),
        "p50 latency admitted (s)": float(admitted.latency_s.median()) if len(admitted) else np.nan,
        "p99 latency admitted (s)": float(admitted.latency_s.quantile(0.99)) if len(admitted) else np.nan,
        "rejection answer p50 (s)": float(rejected.latency_s.median()) if len(rejected) else np.nan,
        # the client's send stamp to the server's app: how long requests wait before the server can see them
        "send to server p50 (s)": float(pd.to_numeric(df.sent_lead_s, errors="coerce").median()) if len(df) else np.nan,
        "answer margin (s)": health.get("answer_margin_s", np.nan),
        "goodput (tokens/s)": float(pd.to_numeric(df.output_tokens[df.outcome == "served"], errors="coerce").sum() / wall),
        "calibration ad": cal.get("ad", np.nan), "calibration sd": cal.get("sd", np.nan),
        "host load (1 min avg)": os.getloadavg()[0],  # other work on the host: the figures depend on it
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scheduler", default="balance")
    ap.add_argument("--users", default="8,16,32,64", help="requests per round, comma-separated (steady runs)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--burst", type=int, default=10, help="burst = this many rounds of the largest load at once (0: no burst runs)")
    ap.add_argument("--hog", type=int, default=1, help="CPU-hog processes beside the server during the second burst (0: no hog run)")
    ap.add_argument("--hog-max-s", type=float, default=600.0, help="each hog process ends after this long whatever happens")
    ap.add_argument("--time-scale", type=float, default=0.25)
    ap.add_argument("--burst-time-scale", type=float, default=0.5, help="deadline multiplier of the bursts (0.5: the paper's 0.5-13 s become 0.25-6.5 s)")
    ap.add_argument("--token-scale", type=float, default=0.5)
    ap.add_argument("--window-s", type=float, default=0.3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--profile", default="cpu1_specsched-pair", help="a profile name or .yaml path measured for the served pair")
    ap.add_argument("--pair", type=Path, default=None)
    ap.add_argument("--pair-preset", default="full", help="the project's pair preset when --pair is not given")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    try:
        loads = [int(u) for u in args.users.split(",")]
    except ValueError:
        raise SystemExit("--users must be comma-separated integers") from None
    if not loads or min(loads) < 1 or max(loads) > 64:
        raise SystemExit("--users must be integers in [1, 64] (the server's max_round)")
    if args.burst < 0 or args.hog < 0 or not args.hog_max_s > 0 or args.rounds < 1:
        raise SystemExit("--burst and --hog must be >= 0, --hog-max-s > 0, --rounds >= 1")
    # everything the servers and the load generator will be given, checked before the pair is built
    # (building it trains a model pair: minutes)
    for name, value in (("--time-scale", args.time_scale), ("--burst-time-scale", args.burst_time_scale), ("--token-scale", args.token_scale),
                        ("--window-s", args.window_s)):
        if not 0 < value < math.inf:
            raise SystemExit(f"{name} must be a finite number > 0, got {value}")
    if args.threads < 1:
        raise SystemExit(f"--threads must be >= 1, got {args.threads}")
    if args.pair is not None and not args.pair.is_dir():
        raise SystemExit(f"--pair must be a built pair folder (target/ + draft/), got {str(args.pair)!r}")
    try:
        ServeConfig(scheduler=args.scheduler, profile=args.profile, window_s=args.window_s, threads=args.threads).validate()
        check_writable(args.out, "--out", directory=True)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    pair = args.pair or build_pair(recipe=args.pair_preset)
    env = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "env" / "paper.yaml"))
    runs = [(f"steady {u}/round", u, args.rounds, True, 0, args.time_scale) for u in loads]
    if args.burst:
        runs.append((f"burst {args.burst}x{max(loads)}", max(loads), args.burst, False, 0, args.burst_time_scale))
        if args.hog:
            runs.append((f"burst {args.burst}x{max(loads)} + {args.hog} CPU hog", max(loads), args.burst, False, args.hog, args.burst_time_scale))
    rows, frames = [], []
    for name, users, rounds, wait, hog_procs, time_scale in runs:
        # a fresh server per run: every run starts from the profile (calibration 1), none inherits another's queue
        proc, url = serve(args.scheduler, pair, free_port(), args.window_s, 0.9, args.profile, args.threads)
        hog = CpuHog(hog_procs, args.hog_max_s) if hog_procs else None
        try:
            start = time.monotonic()
            df, _ = loadgen({"env": env, "url": url, "rounds": rounds, "users": users, "seed": 0, "time_scale": time_scale, "token_scale": args.token_scale,
                             "max_tokens_cap": 160, "round_gap_s": 0.0, "output": None, "timeout_s": 600, "stream": True, "wait_rounds": wait})
            wall = time.monotonic() - start
            health = httpx.get(f"{url}/health", timeout=10).json()
        finally:
            if hog:
                hog.stop()
            proc.terminate()
            proc.wait(timeout=60)
        frames.append(df.assign(run=name))
        rows.append(row_for(df, name, rounds, wall, health))
        print(pd.DataFrame(rows[-1:]).to_markdown(index=False, floatfmt=".3g"), flush=True)
    table = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    cmd = (f"python -m experiments.overload --scheduler {args.scheduler} --users {args.users} --rounds {args.rounds} --burst {args.burst} --hog {args.hog} "
           f"--time-scale {args.time_scale} --burst-time-scale {args.burst_time_scale} --token-scale {args.token_scale} --profile {args.profile}" + (f" --pair-preset {args.pair_preset}" if args.pair is None else " --pair PATH"))
    text = "\n".join([
        "# Overload", "",
        f"`{args.scheduler}` on the live server (pair `{Path(pair).name}`, {args.threads} torch thread(s), profile `{Path(args.profile).name}`, round window {args.window_s} s, "
        f"host: {os.cpu_count()} CPU(s), shared); deadlines x {args.time_scale} (bursts: x {args.burst_time_scale}), outputs x {args.token_scale}. Steady runs: {args.rounds} rounds per load, each sent when the previous "
        f"is answered; bursts: every round sent at once. A rejection is answered when its round is planned, or earlier, as soon as the queue sees it cannot make its deadline "
        f"(deadlines count from each request's send stamp; the queue decides a learnt answer margin early).", "",
        table.to_markdown(index=False, floatfmt=".3g"), "",
        f"Reproduce: `{cmd}`", "",
    ])
    # atomic: a reader never sees half a table
    write_csv_atomic(pd.concat(frames, ignore_index=True), args.out / "overload.csv")
    write_text_atomic(args.out / "overload.md", text)
    print(text)


if __name__ == "__main__":
    main()
