"""The same rounds through the simulator (measured profile) and through the live server.

    python -m experiments.sim_vs_real [--schedulers balance,ad_only,sd_only] [--rounds 5] [--users 8]
    python -m experiments.sim_vs_real --cpu-hog        # one CPU-bound process beside the server

For each scheduler: start ``runtime.serve`` on loopback with the project's pair, replay rounds
with ``runtime.loadgen``, stop the server; then plan the same rounds -- as the server saw them:
prompt tokens, ``max_tokens`` as the output prediction, the deadline less the round window --
with the same scheduler and the same acceptance estimate the server had, on the same profile,
and compute their outcome in the simulator with the server's semantics (each request ends at its
own last token; time-slicing hands a finished batch's share to the other). Reports served count
and p50 latency, real vs simulated, per scheduler and per mode (with the compute time split into
prefill -- up to the first token -- and decoding, so the source of a gap shows).

**Sharing model.** ``--sharing steps`` (default) costs the plan with the executor's actual rule
(``envs.outcome`` ``sharing="steps"``, :mod:`envs.step_sharing`): whole engine steps, so a batch's
first step (AD: its whole prefill) makes the other batch wait instead of sharing -- the server's
semantics, which is what this experiment compares against. ``--sharing work_conserving`` is the
environment's default fluid model (both batches progress at their shares at once; what
EdgeSchedule-v0 rewards), ``fixed`` the paper's. Planning uses the environment's model either way;
``ad_only`` and ``sd_only`` run one batch per round, where all three agree. The choice of default
was made from an analysis of an earlier idle run (``experiments.sim_vs_real_steps``: BALANCE's
served +5.6 % / p50 -11.0 % under the fluid model came from whole-step time-slicing), before the
run published with it. A non-default model's report goes beside the default's, to
``results/sim_vs_real[_cpu_hog]_sharing_<model>.{csv,md}``; every run saves the profile it planned
with beside its CSV (``*_profile.yaml``) so that ``--from-csv`` can re-simulate it under another
model (e.g. ``--from-csv results/sim_vs_real.csv --profile results/sim_vs_real_profile.yaml
--sharing work_conserving``: no server).

**Which profile.** By default (``--profile auto``) a profile measured on *this* machine: the
shipped table for the server's thread count plus a quick calibration measured here on first use
and cached per machine fingerprint (``runtime.machine_profile``; < 2 min once, then instant).
``--profile NAME|PATH`` forces a profile as it is; ``--no-auto-profile`` plans with the shipped
table uncalibrated; ``--remeasure-profile`` measures the calibration again (it is only as good as
the machine's state at first use: measure on an idle machine). The report names the file, why it
was chosen, this machine, where its table and its calibration were measured, and the factors.

**Idle** (default): the server's online calibration is pinned at 1 (it plans with the bare
profile, as the simulator does, and skips its speed probes): the experiment measures the profile
against reality. Writes ``results/sim_vs_real.{csv,md}`` (atomically).

**CPU hog** (``--cpu-hog``): one CPU-bound process runs beside the server, and every scheduler
runs twice: with the server's online self-calibration on (``runtime.calibration``; the simulator
plans and costs with the per-mode factors the server ended with, read from ``/stats``) and off
(both plan with the bare profile: the figure without calibration). Writes
``results/sim_vs_real_cpu_hog.{csv,md}``.

The server runs with one torch thread by default: on a 2-core machine shared with the HTTP stack
and the load generator, two OpenMP threads made the same replay's real p50 swing between 0.71 and
0.94 s over three runs (one thread: 0.93-0.96 s), more than the target error.

This module serves and replays (and holds the CLI); the simulator side is
:mod:`experiments.sim_vs_real_simulate` and the comparison tables and report
:mod:`experiments.sim_vs_real_report`.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pandas as pd
from omegaconf import OmegaConf

from experiments.sim_vs_real_report import compare, compare_by_mode, write_report
from experiments.sim_vs_real_simulate import DEFAULT_SHARING, simulate
from runtime.loadgen import run as loadgen
from runtime.machine_profile import (
    AUTO,
    PlanningProfile,
    add_planning_profile_args,
    check_planning_profile_args,
    resolve_profile,
)
from runtime.pair import build_pair

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"


def free_port() -> int:
    """A TCP port free on loopback now (for a server started next)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(scheduler: str, pair: Path, port: int, window_s: float, alpha: float, profile: str, threads: int, devices: str | None = None, calibrate: bool = True):
    """Start ``runtime.serve`` on loopback; returns (process, url) once ``/health`` answers.
    ``calibrate=False`` pins the server's calibration factor at 1 -- it plans with the bare profile --
    and turns its speed probes off (their samples would be thrown away; the first would delay round 1).
    Returns once the server has also warmed up (its first model calls are slow): the replay must not
    time the warm-up, which the simulator does not model."""
    import tempfile

    cmd = [sys.executable, "-m", "runtime.serve", f"scheduler={scheduler}", f"port={port}", f"pair={pair}", f"window_s={window_s}", f"alpha_init={alpha}",
           "max_tokens_limit=512", f"profile={profile}", f"threads={threads}", "max_queue=4096"]
    if devices:
        cmd.append(f"devices=[{devices}]")
    if not calibrate:
        cmd += ["calibration_bounds=[1.0,1.0]", "calibration_probe_s=0"]
    # the server's log goes to a file: a pipe nobody reads would block it once full
    log = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log, text=True)
    url = f"http://127.0.0.1:{port}"
    for _ in range(1200):
        if proc.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"server exited: {log.read()[-2000:]}")
        try:
            r = httpx.get(f"{url}/health", timeout=1)
            if r.status_code == 200 and r.json().get("warmed_up", True):
                return proc, url
            time.sleep(0.1)
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.terminate()
    raise RuntimeError("server did not start within 120 s")


def server_calibration(url: str) -> dict[str, float]:
    """The per-mode factors (real / predicted step time) the server plans with now (``/stats``)."""
    factors = httpx.get(f"{url}/stats", timeout=10).json()["calibration"]
    return {mode: float(factors[mode]) for mode in ("ad", "sd")}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--schedulers", default="balance,ad_only,sd_only")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--users", type=int, default=8)
    ap.add_argument("--time-scale", type=float, default=0.5)
    ap.add_argument("--token-scale", type=float, default=0.5)
    ap.add_argument("--window-s", type=float, default=0.3)
    ap.add_argument("--alpha", type=float, default=0.9, help="the server's initial acceptance estimate (and the simulator's)")
    ap.add_argument("--completion", default="own", choices=["own", "batch"], help="the simulator's completion model (the server answers each request at its own last token)")
    ap.add_argument("--sharing", default=DEFAULT_SHARING, choices=["work_conserving", "fixed", "steps"],
                    help="the simulator's sharing model: steps (default): the executor's rule on whole engine steps (envs.step_sharing); "
                         "or the environment's fluid ones (work_conserving: the environment's default; fixed); planning always uses the environment's model")
    ap.add_argument("--stream", action=argparse.BooleanOptionalAction, default=True, help="stream tokens to the load generator")
    ap.add_argument("--threads", type=int, default=1, help="the server's torch threads (the profile is measured with as many)")
    add_planning_profile_args(ap, "measured on this machine, cached")
    ap.add_argument("--cpu-hog", action="store_true", help="run one CPU-bound process beside the server; each scheduler runs with the server's online calibration on and off")
    ap.add_argument("--devices", default=None, help="two devices for the server, e.g. cpu,cpu or cuda:0,cuda:1 (the simulator still models one shared device)")
    ap.add_argument("--pair", type=Path, default=None)
    ap.add_argument("--from-csv", type=Path, default=None,
                    help="re-simulate the real rows of an earlier idle run's CSV with this run's simulator settings (e.g. --sharing steps) instead of serving; "
                         "give the --profile that run planned with")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    check_args(ap, args)
    # re-simulating with a named profile needs no pair: nothing is served or measured
    pair = args.pair or (None if args.from_csv is not None and args.profile != AUTO else build_pair())
    device = args.devices.split(",")[0] if args.devices else "cpu"
    planning = resolve_profile(args.profile, pair=pair, device=device, threads=args.threads, auto=args.auto_profile, refresh=args.remeasure_profile)
    print(planning.describe(), flush=True)
    if args.from_csv is not None:
        resimulate(args, planning)
        return
    env = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "env" / "paper.yaml"))
    settings = [(name, calibrate) for name in args.schedulers.split(",") for calibrate in ((True, False) if args.cpu_hog else (False,))]
    frames, summary, by_mode = [], [], []
    hog = cpu_hog() if args.cpu_hog else None  # started after the profile is measured: the profile describes the idle machine
    try:
        for i, (name, calibrate) in enumerate(settings, 1):
            label = "on" if calibrate else "off"
            print(f"[{i}/{len(settings)}] {name}, online calibration {label}{', CPU hog running' if hog else ''}", flush=True)
            # idle: the server plans with the bare profile, as the simulator does -- this compares the profile with reality
            proc, url = serve(name, pair, free_port(), args.window_s, args.alpha, str(planning.path), args.threads, args.devices, calibrate=calibrate)
            try:
                real, _ = loadgen({"env": env, "url": url, "rounds": args.rounds, "users": args.users, "seed": 0, "time_scale": args.time_scale, "token_scale": args.token_scale,
                                   "max_tokens_cap": 160, "round_gap_s": 0.0, "output": None, "timeout_s": 300, "stream": args.stream})
                factors = server_calibration(url) if calibrate else None
            finally:
                proc.terminate()
                proc.wait(timeout=60)
            sim = simulate(real, name, args.window_s, args.alpha, args.completion, args.sharing, str(planning.path), factors)
            both = real.merge(sim, on=["round", "user"]).assign(scheduler=name, calibration=label)
            frames.append(both)
            extra = {"calibration": label, **({f"factor {m}": f for m, f in factors.items()} if factors else {})} if args.cpu_hog else {}
            summary.append({**compare(both, name, args.window_s), **extra})
            by_mode.extend({**row, **({"calibration": label} if args.cpu_hog else {})} for row in compare_by_mode(both, name, args.window_s))
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
    write_report(args, planning, pd.concat(frames, ignore_index=True), pd.DataFrame(summary), pd.DataFrame(by_mode))


def resimulate(args, planning: PlanningProfile) -> None:
    """``--from-csv``: the simulator side again, on the real rows of an earlier idle run (no server)."""
    old = pd.read_csv(args.from_csv)
    if "calibration" in old and (old.calibration == "on").any():
        raise SystemExit(f"--from-csv {args.from_csv} is a CPU-hog run with online calibration (its factors are not in the CSV): re-simulate idle runs only")
    real_cols = [c for c in old.columns if not c.startswith("sim_") and c not in ("scheduler", "calibration")]
    names = [n for n in args.schedulers.split(",") if (old.scheduler == n).any()]
    if not names:
        raise SystemExit(f"--from-csv {args.from_csv} has no rows of the schedulers {args.schedulers}")
    frames, summary, by_mode = [], [], []
    for name in names:
        real = old[old.scheduler == name][real_cols]
        both = real.merge(simulate(real, name, args.window_s, args.alpha, args.completion, args.sharing, str(planning.path)), on=["round", "user"]).assign(scheduler=name)
        frames.append(both)
        summary.append(compare(both, name, args.window_s))
        by_mode.extend(compare_by_mode(both, name, args.window_s))
    args.rounds, args.users = int(old["round"].nunique()), int(old.groupby(["scheduler", "round"]).size().max())
    write_report(args, planning, pd.concat(frames, ignore_index=True), pd.DataFrame(summary), pd.DataFrame(by_mode))


def check_args(ap: argparse.ArgumentParser, args) -> None:
    """Bad settings fail here, naming the option, before a pair is built or a profile measured."""
    from agents.registry import SCHEDULERS

    if args.from_csv is not None and (args.cpu_hog or not args.from_csv.is_file()):
        ap.error(f"--from-csv must be an existing idle run's CSV (not with --cpu-hog), got {args.from_csv}")
    if args.from_csv is not None and args.remeasure_profile:
        ap.error("--from-csv re-simulates with the profile that run planned with: no --remeasure-profile")

    unknown = [s for s in args.schedulers.split(",") if s not in SCHEDULERS]
    if unknown:
        ap.error(f"--schedulers: unknown {unknown}; known: {sorted(SCHEDULERS)}")
    for name, lo, hi in (("rounds", 1, None), ("users", 1, 64), ("threads", 1, None)):
        v = getattr(args, name)
        if v < lo or (hi is not None and v > hi):
            ap.error(f"--{name} must be an integer in [{lo}, {hi or 'inf'}], got {v}")
    for name in ("time_scale", "token_scale", "window_s"):
        if not getattr(args, name) > 0:
            ap.error(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    if not 0 < args.alpha < 1:
        ap.error(f"--alpha must be in (0, 1), got {args.alpha}")
    if args.pair is not None and not args.pair.is_dir():
        ap.error(f"--pair must be a built pair folder, got {args.pair}")
    check_planning_profile_args(ap, args)


def cpu_hog() -> subprocess.Popen:
    """One CPU-bound process (a busy Python loop) beside the server, until killed."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


if __name__ == "__main__":
    main()
