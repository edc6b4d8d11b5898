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
"""

from __future__ import annotations

import argparse
import dataclasses
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from agents.artefacts import write_csv_atomic, write_text_atomic
from agents.registry import make_scheduler
from envs.config import EnvConfig
from envs.cost_model import CostModel
from envs.outcome import evaluate_plan
from envs.plan import AD, SD
from envs.profile import load_profile
from envs.workload import Round
from runtime.calibration import CalibratedCostModel, StepCalibration
from runtime.loadgen import run as loadgen
from runtime.machine_profile import AUTO, PlanningProfile, resolve_profile
from runtime.pair import build_pair

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"
#: the simulator's default sharing model: the executor's whole-step rule (see the module docstring)
DEFAULT_SHARING = "steps"


def free_port() -> int:
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


def measured_alpha(g: pd.DataFrame, fallback: np.ndarray) -> np.ndarray:
    """Per-request acceptance the server measured (SD requests with a full iteration), else ``fallback``."""
    if "sd_accepted" not in g:
        return fallback
    acc, rej = g.sd_accepted.to_numpy(dtype=float), g.sd_rejections.to_numpy(dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        a = acc / (acc + rej)
    return np.where(np.isfinite(a), np.clip(a, 0.0, 0.999), fallback)


def simulate(df: pd.DataFrame, scheduler: str, window_s: float, alpha: float, completion: str, sharing: str, profile: str,
             factors: dict[str, float] | None = None) -> pd.DataFrame:
    """Plan each round as the server did (same inputs, same acceptance estimate) and cost it.

    Two outcomes: ``sim`` realises the estimate (what the environment predicts), ``sim_measured``
    realises each SD request's measured acceptance (isolating the cost model from acceptance).
    ``factors``: the server's online calibration (real / predicted step time per mode); planning
    and costing both scale the profile's AD and SD batch times by them, as the server's planner does.
    """
    cost = CostModel(load_profile(profile))
    if factors is not None:
        calibration = StepCalibration()
        for mode, f in factors.items():
            calibration.update(mode, f, 1.0)  # the first sample is the factor (no smoothing, no margin)
        cost = CalibratedCostModel(cost, calibration)
    sched = make_scheduler(scheduler, cost, EnvConfig.max_gamma, seed=0)  # the server's largest draft depth (runtime.rounds)
    rows = []
    for r, g in df.groupby("round"):
        n = len(g)
        planned = g.alpha_planned.dropna() if "alpha_planned" in g else pd.Series(dtype=float)
        a_plan = float(planned.iloc[0]) if len(planned) else alpha
        # as the server builds its rounds (runtime.rounds): measured requests, no link time over loopback
        rnd = Round.from_requests(g.prompt_tokens.to_numpy(), g.max_tokens.to_numpy(), np.maximum(g.deadline_s.to_numpy() - window_s, 1e-6), np.full(n, a_plan),
                                  uplink_s=0.0, downlink_s=0.0)
        plan = sched.plan(rnd)
        measured = dataclasses.replace(rnd, realized_alpha=measured_alpha(g, rnd.alpha))
        # sharing "steps": the profile's engine steps, each scaled by its mode's calibration factor as the batch times are
        out, out_m = (evaluate_plan(cost, x, plan, completion=completion, sharing=sharing) for x in (rnd, measured))
        prefill = prefill_s(cost.profile, rnd, plan, factors)
        for k, (_, row) in enumerate(g.iterrows()):
            lat = out.latency_s[k] + window_s if np.isfinite(out.latency_s[k]) else np.nan
            lat_m = out_m.latency_s[k] + window_s if np.isfinite(out_m.latency_s[k]) else np.nan
            rows.append({"round": r, "user": row.user, "sim_mode": {AD: "ad", SD: "sd"}.get(int(plan.modes[k]), "-"),
                         "sim_served": bool(out.served[k]), "sim_latency_s": lat,
                         "sim_measured_served": bool(out_m.served[k]), "sim_measured_latency_s": lat_m, "sim_prefill_s": prefill[k]})
    return pd.DataFrame(rows)


def prefill_s(profile, rnd: Round, plan, factors: dict[str, float] | None = None) -> np.ndarray:
    """Per user, the simulated time to its batch's first token: the batch's first engine step on the
    whole device -- AD: the target's pass over the padded prompts; SD: both models' prefills and one
    draft-verify iteration (``runtime.engines`` yields only after it) -- NaN for rejected users.

    Not at the batch's compute share: ``runtime.executor.run_shared`` runs a step whole, so a
    batch's first step starts at once or after the other batch's first step, at full speed. (Dividing
    by the share, as the fluid sharing model spreads it, put the AD prefill at 0.41 s against 0.26 s
    real in a BALANCE run, and so moved ~0.15 s of the same compute time from "decode" to "prefill".)
    """
    out = np.full(rnd.num_users, np.nan)
    iteration = CostModel(profile).sd_iteration_time
    for mode, key in ((AD, "ad"), (SD, "sd")):
        members = plan.modes == mode
        if not members.any():
            continue
        b, s = int(members.sum()), int(rnd.input_tokens[members].max())
        t = float(profile.tau_llm.tau(b, s, s))
        if mode == SD:
            t += float(profile.tau_slm.tau(b, s, s)) + float(iteration(b, s, int(plan.gamma)))
        out[members] = t * (factors or {}).get(key, 1.0)
    return out


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
    ap.add_argument("--profile", default=AUTO, help="the profile both the server and the simulator plan with: auto (measured on this machine, cached) or a NAME / .yaml PATH used as it is")
    ap.add_argument("--auto-profile", action=argparse.BooleanOptionalAction, default=True, help="with --profile auto: measure (once, cached) a calibration of the shipped table on this machine; off: the shipped table as it is")
    ap.add_argument("--remeasure-profile", action="store_true", help="with --profile auto: measure this machine's calibration again even if cached (e.g. the cached one was measured on a busy machine)")
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
    if args.profile != AUTO and (not args.auto_profile or args.remeasure_profile):
        ap.error("--no-auto-profile and --remeasure-profile only apply to --profile auto (a named profile is always used as it is)")
    if args.remeasure_profile and not args.auto_profile:
        ap.error("--remeasure-profile contradicts --no-auto-profile")


def cpu_hog() -> subprocess.Popen:
    """One CPU-bound process (a busy Python loop) beside the server, until killed."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def profile_lines(planning: PlanningProfile) -> list[str]:
    """Which profile and calibration the run planned with, for the report."""
    s = planning.summary()

    def short(path: str) -> str:  # repository-relative, or ~ for the home folder's cache
        return path.replace(str(ROOT) + "/", "").replace(str(Path.home()), "~")

    return [f"- profile: `{short(s['profile'])}` ({s['source']}; base `{short(s['base'])}`; this machine's key `{s['machine key']}`)",
            f"- this machine: {s['this machine']}", f"- table measured on: {s['table measured on']}", f"- calibration measured on: {s['calibration measured on']}",
            f"- calibration (measured / table pass time, per model and new tokens q): {s['calibration']}",
            f"- engine overhead (engine wall time beyond the calibrated passes): {s['engine overhead']}"]


def write_report(args, planning: PlanningProfile, df: pd.DataFrame, table: pd.DataFrame, modes: pd.DataFrame) -> None:
    # another simulator sharing model than the default writes beside the default's report, not over it
    stem = ("sim_vs_real_cpu_hog" if args.cpu_hog else "sim_vs_real") + ("" if args.sharing == DEFAULT_SHARING else f"_sharing_{args.sharing}")
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv_atomic(df, args.out / f"{stem}.csv")  # a reader never sees half a table
    if args.from_csv is None:  # the profile both sides planned with, beside the CSV: --from-csv can re-simulate it later
        write_text_atomic(args.out / f"{stem}_profile.yaml", Path(planning.path).read_text())
    cmd = f"python -m experiments.sim_vs_real --schedulers {args.schedulers} --rounds {args.rounds} --users {args.users}" + (f" --devices {args.devices}" if args.devices else "")
    cmd += (f" --profile {args.profile}" if args.profile != AUTO else "") + ("" if args.auto_profile else " --no-auto-profile")
    cmd += (" --cpu-hog" if args.cpu_hog else "") + (" --pair PATH" if args.pair else "")
    cmd += ("" if args.sharing == DEFAULT_SHARING else f" --sharing {args.sharing}") + ("" if args.completion == "own" else f" --completion {args.completion}")
    if args.from_csv is not None:
        cmd += f" --from-csv {args.from_csv}"
    setting = ("one CPU-bound process (a busy loop) ran beside the server throughout; each scheduler ran with the server's online calibration on "
               "(the simulator plans and costs with the per-mode factors the server ended with: columns *factor*) and off (both plan with the bare profile). "
               if args.cpu_hog else "the server's online calibration pinned at 1 (it plans with the bare profile, as the simulator does). ")
    text = "\n".join([
        "# Simulated vs real" + (" with a CPU hog" if args.cpu_hog else ""), "",
        *([f"Re-simulated from the real rows of `{args.from_csv}` (no server ran for this report).", ""] if args.from_csv is not None else []),
        f"{args.rounds} rounds x {args.users} requests per scheduler, deadlines x {args.time_scale}, outputs x {args.token_scale}, round window {args.window_s} s; "
        f"the project's pair on this CPU, server with {args.threads} torch thread(s){f' per device, devices {args.devices}' if args.devices else ''}; {setting}"
        f"Simulator outcome: completion `{args.completion}`, sharing `{args.sharing}`. "
        "Latency is from the request's arrival to its last token (the round window included). "
        "*sim* realises the acceptance estimate the server planned with (what the environment predicts); *sim, measured acceptance* realises each SD request's measured acceptance.", "",
        "Server and simulator planned with:", "", *profile_lines(planning), "",
        table.to_markdown(index=False, floatfmt=".3g"), "",
        "By mode (requests that ran in that mode in both). Compute = latency - wait - planning (real), latency - window (simulated); "
        "prefill = time to the first token - wait - planning (real), the batch's first engine step on the whole device (simulated: AD its prefill, SD both prefills and one iteration; the executor runs a step whole); decode = compute - prefill:", "",
        modes.to_markdown(index=False, floatfmt=".3g"), "",
        f"Reproduce: `{cmd}`" + ("" if args.from_csv is not None else f" (the profile it planned with is saved as `{stem}_profile.yaml`"
                                  + (")" if args.cpu_hog else f"; re-simulate this run with `--from-csv {stem}.csv --profile {stem}_profile.yaml`)")), "",
    ])
    write_text_atomic(args.out / f"{stem}.md", text)
    print(text)


def compare(both: pd.DataFrame, name: str, window_s: float) -> dict:
    """Served count and p50 latency, real vs simulated, for one scheduler (and its compute p50 error per mode)."""
    done = both.outcome.isin(["served", "late"])
    real_served = int((both.outcome == "served").sum())
    real_p50 = both.latency_s[done].median()
    row = {"scheduler": name, "requests": len(both), "served (real)": real_served}
    for label, col in (("sim", "sim"), ("sim, measured acceptance", "sim_measured")):
        served = int(both[f"{col}_served"].sum())
        row[f"served ({label})"] = served
        row[f"served error % ({label})"] = (served - real_served) / max(real_served, 1) * 100
    row["late (real)"] = int((both.outcome == "late").sum())
    row["p50 latency real (s)"] = real_p50
    for label, col in (("sim", "sim"), ("sim, measured acceptance", "sim_measured")):
        p50 = both[f"{col}_latency_s"].dropna().median()
        row[f"p50 ({label}) (s)"] = p50
        row[f"p50 error % ({label})"] = (p50 - real_p50) / real_p50 * 100 if real_p50 else np.nan
    row["same modes (%)"] = float((both["mode"].fillna("-") == both.sim_mode).mean() * 100)
    for mode_row in compare_by_mode(both, name, window_s):  # where a latency gap comes from
        row[f"{mode_row['mode'].upper()} compute p50 error %"] = mode_row["error %"]
    return row


def compare_by_mode(both: pd.DataFrame, name: str, window_s: float) -> list[dict]:
    """Compute time per mode, real vs simulated, split into prefill (to the first token) and decoding."""
    rows = []
    for mode in ("ad", "sd"):
        m = both[(both["mode"] == mode) & (both.sim_mode == mode) & both.outcome.isin(["served", "late"])]
        if m.empty:
            continue
        real = (m.latency_s - m.wait_s - m.plan_s) if "wait_s" in m else pd.Series(np.nan, index=m.index)
        sim = m.sim_latency_s - window_s
        real_pre = (m.ttft_s - m.wait_s - m.plan_s) if "ttft_s" in m and "wait_s" in m else pd.Series(np.nan, index=m.index)
        sim_pre = m.sim_prefill_s if "sim_prefill_s" in m else pd.Series(np.nan, index=m.index)
        row = {"scheduler": name, "mode": mode, "requests": len(m), "compute p50 real (s)": real.median(), "compute p50 sim (s)": sim.median(),
               "error %": _err(sim.median(), real.median()), "prefill p50 real (s)": real_pre.median(), "prefill p50 sim (s)": sim_pre.median(),
               "prefill error %": _err(sim_pre.median(), real_pre.median()), "decode p50 real (s)": (real - real_pre).median(),
               "decode p50 sim (s)": (sim - sim_pre).median(), "decode error %": _err((sim - sim_pre).median(), (real - real_pre).median())}
        rows.append(row)
    return rows


def _err(sim: float, real: float) -> float:
    return (sim - real) / real * 100 if real and np.isfinite(real) else np.nan


if __name__ == "__main__":
    main()
