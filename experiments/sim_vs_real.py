"""The same rounds through the simulator (measured profile) and through the live server.

    python -m experiments.sim_vs_real [--schedulers balance,ad_only,sd_only] [--rounds 5] [--users 8]

For each scheduler: start ``runtime.serve`` on loopback with the project's pair, replay rounds
with ``runtime.loadgen``, stop the server; then plan the same rounds -- as the server saw them:
prompt tokens, ``max_tokens`` as the output prediction, the deadline less the round window --
with the same scheduler on the measured profile (``conf/profile/cpu_specsched-pair.yaml``) and
compute their outcome in the simulator. Reports served count and p50 latency, real vs simulated,
and their errors. Writes ``results/sim_vs_real.{csv,md}``.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from agents.registry import make_scheduler
from envs.config import EnvConfig
from envs.feasibility import CostModel
from envs.outcome import evaluate_plan
from envs.profile import load_profile
from envs.workload import Round
from runtime.loadgen import run as loadgen
from runtime.pair import build_pair

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(scheduler: str, pair: Path, port: int, window_s: float, alpha: float):
    cmd = [sys.executable, "-m", "runtime.serve", f"scheduler={scheduler}", f"port={port}", f"pair={pair}", f"window_s={window_s}", f"alpha_init={alpha}", "max_tokens_limit=512"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {proc.stderr.read()[-2000:]}")
        try:
            if httpx.get(f"{url}/metrics", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.terminate()
    raise RuntimeError("server did not start within 60 s")


def simulate(df: pd.DataFrame, scheduler: str, window_s: float, alpha: float) -> pd.DataFrame:
    profile = "cpu_specsched-pair"
    cost = CostModel(load_profile(profile))
    cfg = EnvConfig(num_users=1, profile=profile, input_tokens=[1, 1 << 20], output_tokens=[1, 1 << 20], deadline_s=[1e-6, 1e6], max_users=64)
    sched = make_scheduler(scheduler, cost, cfg, seed=0)
    rows = []
    for r, g in df.groupby("round"):
        n = len(g)
        rnd = Round.from_arrays(cfg, g.prompt_tokens.to_numpy(), g.max_tokens.to_numpy(), np.maximum(g.deadline_s.to_numpy() - window_s, 1e-6), np.full(n, alpha), np.full(n, cfg.min_distance_m))
        plan = sched.plan(rnd)
        out = evaluate_plan(cost, rnd, plan)
        for k, (_, row) in enumerate(g.iterrows()):
            lat = out.latency_s[k] + window_s if np.isfinite(out.latency_s[k]) else np.nan
            rows.append({"round": r, "user": row.user, "sim_served": bool(out.served[k]), "sim_latency_s": lat})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--schedulers", default="balance,ad_only,sd_only")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--users", type=int, default=8)
    ap.add_argument("--time-scale", type=float, default=0.5)
    ap.add_argument("--token-scale", type=float, default=0.5)
    ap.add_argument("--window-s", type=float, default=0.3)
    ap.add_argument("--alpha", type=float, default=0.9, help="the server's initial acceptance estimate (and the simulator's)")
    ap.add_argument("--pair", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    pair = args.pair or build_pair()
    env = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "env" / "paper.yaml"))
    frames, summary = [], []
    for name in args.schedulers.split(","):
        proc, url = serve(name, pair, free_port(), args.window_s, args.alpha)
        try:
            real, _ = loadgen({"env": env, "url": url, "rounds": args.rounds, "users": args.users, "seed": 0, "time_scale": args.time_scale, "token_scale": args.token_scale, "max_tokens_cap": 160, "round_gap_s": 0.0, "output": None, "timeout_s": 300})
        finally:
            proc.terminate()
            proc.wait(timeout=60)
        sim = simulate(real, name, args.window_s, args.alpha)
        both = real.merge(sim, on=["round", "user"]).assign(scheduler=name)
        frames.append(both)
        real_served = int((both.outcome == "served").sum())
        sim_served = int(both.sim_served.sum())
        real_p50 = both.latency_s[both.outcome.isin(["served", "late"])].median()
        sim_p50 = both.sim_latency_s.dropna().median()
        summary.append({
            "scheduler": name, "requests": len(both), "served (real)": real_served, "served (sim)": sim_served,
            "served error (%)": (sim_served - real_served) / max(real_served, 1) * 100,
            "late (real)": int((both.outcome == "late").sum()),
            "p50 latency real (s)": real_p50, "p50 latency sim (s)": sim_p50, "p50 error (%)": (sim_p50 - real_p50) / real_p50 * 100 if real_p50 else np.nan,
            "same admissions (%)": float(((both.outcome != "rejected") == both.sim_latency_s.notna()).mean() * 100),
        })
    df = pd.concat(frames, ignore_index=True)
    table = pd.DataFrame(summary)
    args.out.mkdir(parents=True, exist_ok=True)
    df.to_csv(args.out / "sim_vs_real.csv", index=False)
    text = "\n".join([
        "# Simulated vs real", "",
        f"{args.rounds} rounds x {args.users} requests per scheduler, deadlines x {args.time_scale}, outputs x {args.token_scale}, round window {args.window_s} s; the project's pair on this CPU; the simulator plans and costs with `conf/profile/cpu_specsched-pair.yaml`.", "",
        table.to_markdown(index=False, floatfmt=".3g"), "",
        f"Reproduce: `python -m experiments.sim_vs_real --schedulers {args.schedulers} --rounds {args.rounds} --users {args.users}`", "",
    ])
    (args.out / "sim_vs_real.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
