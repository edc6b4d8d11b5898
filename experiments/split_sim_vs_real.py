"""Simulated (EdgeSchedule-v1 model) vs real for edge users: ``runtime.serve placement=split`` live on
this CPU, then the same rounds through the v1 simulator on the measured role profile.

    python -m experiments.split_sim_vs_real                      # edge_first, balance_ed, the v1 policy; ED-only and mixed rounds
    python -m experiments.split_sim_vs_real --schedulers edge_first --rounds 4

For each scheduler: start ``runtime.serve placement=split`` on loopback with the project's full pair
and the planning profile (below); the server's online calibration pinned at 1 and its speed probes
off, so it plans with the bare profile, as the simulator does. Then for each setting drive rounds of
users, one round at a time, all of a round's users at once:

- ``ed``: ``--edge-users`` edge users (each its own :class:`runtime.split_placement.EdgeUser`: its
  draft model in this process, its verification link delayed by its RTT, drafting at the plan's depth);
- ``mix``: ``--edge-users`` edge users and ``--http-users`` HTTP users (OpenAI completions);

driven by :mod:`runtime.split_loadgen` (the load generator of both kinds of users).

Prompts cycle through the pair's prompt lists; ``max_tokens`` and deadlines are drawn per user from a
seeded generator (``--tokens``, ``--deadline-s``), RTTs from ``--rtt-ms``. Then each round is planned
again by the same scheduler as the server saw it -- prompt tokens, ``max_tokens`` as the output
prediction, the deadline less the round window, ``has_edge`` and ``rtt_s`` -- on the same profile,
with the acceptance estimate the server had, and costed with ``envs.split_outcome.evaluate_split_plan``
(each user's realised output length). Every user ends at its own last token -- ED users
(``ed_completion="own"``) and AD/SD users (``completion="own"``: its own passes at its batch's
size and share) -- the server's semantics, as ``experiments.sim_vs_real`` uses v0's
``completion="own"``; ``--completion batch`` for v1's default, every user ending at its batch's end.
The batch-completion figure with the estimate realised is always reported beside it (*sim, batch
completion*). Runs published before 2026-12-02 (stop 37) ended simulated AD/SD users at their
batch's end even with ``--completion own``: ``--resimulate`` rewrites such a run's report. *sim* realises the estimate; *sim, measured acceptance*
realises each ED user's measured acceptance (accepted / (accepted + rejecting iterations), from the
edge's iteration log) and each SD user's. Latency: the request's arrival at the server to its end
(ED: the edge's report of its last token reaching the server), the simulated one plus the round
window. Reports served count and p50 latency of ED users (mode ED in both) and of everyone, real vs
simulated (the simulator side: :mod:`experiments.split_sim_vs_real_simulate`; the report and
``--resimulate``: :mod:`experiments.split_sim_vs_real_record`). Writes
``results/split_sim_vs_real/{requests.csv,summary.csv,summary.md}`` atomically.

**Which profile.** By default (``--profile auto``) the shipped split profile of the pair for the
thread count (``split_cpu1_specsched-pair``: the target's and the draft's pass times measured with one
torch thread on this kind of CPU, ``runtime.profile --role``) calibrated to *this* machine, server and
edge alike, since here the edges draft on it too (``runtime.machine_profile.resolve_profile``,
``edge_here``: a quick calibration, < 2 min, cached per machine fingerprint), as
``experiments.sim_vs_real`` does for v0. Why: every real latency moves with the host's speed and
the simulator's do not. The report records the host (this machine's fingerprint, in the planning
profile's line). ``--remeasure-profile`` measures the calibration again (the comparison is only as
good as the calibration is current); ``--no-auto-profile`` plans with the shipped table as it is;
``--profile NAME|PATH`` forces a profile. The report names the file, why it was chosen and the
factors, and the run saves it beside its CSVs (``profile.yaml``). A calibration cannot help on a
host whose speed is not steady: on an Intel Xeon host (a run not kept under ``results/``) the same
target pass took 8.3 or 13 ms from one second to the next, two quick calibrations a minute apart
gave the target x2.2 and x1.5 at q = 5, and the calibrated run was -5 % to +28 % off.

**One server core** (``--pin-cpus on``, the default with 2+ CPUs): the server process runs on one
CPU and this process (the edges' drafting) on another, as ``experiments.split_bench`` does. The
model has one server that the ED verify batch and the AD/SD batches share; unpinned, the verifier
and the SD engine can run side by side on the two cores (likely; not measured), and under
``edge_first`` the HTTP (SD) users of mixed rounds finished well before the model said (that row
+19 % to +30 % off in the four calibrated or unrecorded-host unpinned runs, -5.4 % to +6.3 % pinned).
Pinned, the ED users' p50 errors came out negative in all four runs of 2026-12-02 (-2.7 % to -12.6 %,
real slower); in those four unpinned runs, positive in 7 of their 8 rows (the eighth -0.0 %).

**How the verifier shares the server's core** (``--device-sharing``, the server's
``split.device_sharing``): ``turns`` (default) makes the verifier and the AD/SD engines take weighted
turns at the plan's ED share (:mod:`runtime.device_turns`), the model's premise; ``os`` runs them as
two free threads, as every run before 2026-12-03 did (a report without the option is read as
``os``). What the switch changes part by part (the report's last table), and what the model still
leaves out: the README's section on the live server with edge users
(``results/split_sim_vs_real/*/summary.md``).

**Which round trip** (``--rtt-report``): ``measured`` (default) has each edge user report the
emulated RTT plus the stack time its own recent round trips took beyond their emulated delays (gRPC
on loopback, both processes' threads, the edge finishing a proactive draft step: 2.3 to 3.9 ms per
round trip in the eight runs before it, none of which the emulated RTT holds;
:mod:`runtime.split.rtt_estimate`), after one probe generation per edge user at the RTT range's
midpoint (not a round: nothing planned or counted; a failed probe is reported and the run goes on); the server and
the simulator plan with the reported value (``reported_rtt_s`` in ``requests.csv``). ``link``
reports the emulated RTT alone, as every run before 2026-12-03 (stop 43) did (a report without the
option is read as ``link``).

**Re-simulating a finished run.** ``--resimulate DIR`` reads ``DIR/requests.csv`` (the live part's
records), plans and costs its rounds again with this code and ``DIR/profile.yaml`` (or ``--profile``
when the run saved none), and rewrites ``requests.csv``, ``summary.csv`` and ``summary.md`` in
``--out`` (default ``DIR``), with ``profile.yaml``; the live part is not rerun. The run's options
come from its report's ``Reproduce`` line (a report from before ``--pin-cpus`` ran unpinned); a
live option given on the command line that contradicts it is an error, and without such a line the
options given describe the run. Schedulers, settings, rounds and users per round are checked
against the records. The report keeps the run's planning-profile and wall-time lines and adds the
re-simulation's command; ``--completion`` and ``--sim-rtt`` (an ablation: the emulated RTT instead
of the reported one) are the simulator's and may differ from the run's.

**Edge devices.** The edges' draft models share this process's CPU (one torch thread); the model
gives every edge its own device. Few concurrent edge users per round keep that difference small.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import pandas as pd

from envs.profile import ProfileError, load_profile
from envs.split_outcome import ED_COMPLETIONS
from experiments.sim_vs_real import free_port
from experiments.split_sim_vs_real_record import command, recorded_options, resimulate, write_report
from experiments.split_sim_vs_real_simulate import SIM_RTTS, compare, simulate
from runtime.cpu_pinning import available_cpus, pin_process
from runtime.machine_profile import (
    AUTO,
    add_planning_profile_args,
    check_planning_profile_args,
    default_split_base,
    resolve_profile,
)
from runtime.serve_config import DEVICE_SHARING
from runtime.split_loadgen import add_round_args, check_ranges, draw_round, probe_links, run_round

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results" / "split_sim_vs_real"
SETTINGS = ("ed", "mix")


def start_server(scheduler: str, pair: Path, profile: str, window_s: float, alpha: float, cohorts: int, threads: int, policy: str | None,
                 cpus: set[int] | None = None, device_sharing: str = "turns"):
    """``runtime.serve placement=split`` in its own process (on ``cpus`` when given: every thread it
    starts inherits them); returns (process, http url, grpc address) once warmed up."""
    port, split_port = free_port(), free_port()
    cmd = [sys.executable, "-m", "runtime.serve", f"scheduler={scheduler}", f"port={port}", f"pair={pair}", f"profile={profile}", f"window_s={window_s}",
           f"alpha_init={alpha}", f"threads={threads}", "placement=split", f"split.port={split_port}", f"split.cohorts={cohorts}",
           f"split.device_sharing={device_sharing}", "calibration_bounds=[1.0,1.0]", "calibration_probe_s=0", "max_queue=4096"]
    if policy:
        cmd.append(f"policy_path={policy}")
    log = tempfile.TemporaryFile(mode="w+")  # a pipe nobody reads would block the server once full
    mine = os.sched_getaffinity(0) if cpus else None
    if cpus:  # the child inherits the mask of the thread that starts it (no preexec_fn: unsafe with threads)
        os.sched_setaffinity(0, cpus)
    try:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log, text=True)
    finally:
        if mine is not None:
            os.sched_setaffinity(0, mine)
    url = f"http://127.0.0.1:{port}"
    for _ in range(1800):
        if proc.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"server exited: {log.read()[-3000:]}")
        try:
            h = httpx.get(f"{url}/health", timeout=1).json()
            if h.get("warmed_up") and h.get("split_port"):
                return proc, url, f"127.0.0.1:{h['split_port']}"
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.1)
    proc.terminate()
    raise RuntimeError("server did not start within 180 s")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--schedulers", default="edge_first,balance_ed,policy", help="comma-separated: balance_ed, edge_first, policy (with --policy)")
    ap.add_argument("--policy", default="policies/split_k20", help="the v1 policy for scheduler policy")
    ap.add_argument("--settings", default="ed,mix", help="comma-separated: ed (edge users only), mix (edge + HTTP users)")
    ap.add_argument("--rounds", type=int, default=24, help="rounds per setting (24: ~45 edge users per row, so one request is ~2 %% of a row)")
    add_round_args(ap)
    ap.add_argument("--window-s", type=float, default=0.3)
    ap.add_argument("--alpha", type=float, default=0.8, help="the server's initial acceptance estimate")
    ap.add_argument("--cohorts", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the server and of the edges (the profile is measured with one)")
    add_planning_profile_args(ap, "the shipped split profile calibrated on this machine, server and edge; cached")
    ap.add_argument("--pair", type=Path, default=None, help="a built pair folder (default: the project's full pair, built and cached)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pin-cpus", choices=["on", "off"], default="on" if len(available_cpus()) >= 2 else "off",
                    help="on (default with 2+ CPUs): the server on one CPU and this process (the edges' drafting) on another "
                         "(runtime.cpu_pinning), so the server's verifier and engines share one core, as the model's one server; off: both anywhere")
    ap.add_argument("--device-sharing", choices=list(DEVICE_SHARING), default="turns",
                    help="the server's split.device_sharing: turns (default; the verifier gets the plan's ED share of the device, "
                         "runtime.device_turns) or os (the verifier and the engines as two free threads)")
    ap.add_argument("--completion", default="own", choices=list(ED_COMPLETIONS),
                    help="when simulated users end: own (each at its own last token, as the server answers) or batch (at its batch's end, v1's default)")
    ap.add_argument("--sim-rtt", default="reported", choices=list(SIM_RTTS),
                    help="the round trip the simulator plans edge users with: reported (default: what each reported to the server) or "
                         "emulated (the emulated RTT alone: an ablation of the measured stack time)")
    ap.add_argument("--out", type=Path, default=None, help=f"where to write (default {RESULTS.relative_to(ROOT)}; with --resimulate, its DIR)")
    ap.add_argument("--resimulate", type=Path, default=None, metavar="DIR",
                    help="re-simulate the finished run in DIR (its requests.csv) without a live part, with the arguments its report's "
                         "Reproduce line records (or, without one, those given)")
    args = ap.parse_args(argv)
    if args.resimulate is not None:
        if not (args.resimulate / "requests.csv").is_file():
            ap.error(f"--resimulate: {args.resimulate / 'requests.csv'} does not exist")
        try:
            args = recorded_options(ap, args)
        except ValueError as exc:
            ap.error(f"--resimulate: {exc}")
        if args.profile == AUTO and not (args.resimulate / "profile.yaml").is_file():
            ap.error(f"--resimulate: {args.resimulate} has no profile.yaml; name the profile the run planned with (--profile NAME|PATH)")
    if args.out is None:
        args.out = args.resimulate if args.resimulate is not None else RESULTS
    known = {"balance_ed", "edge_first", "policy"}
    if not set(args.schedulers.split(",")) <= known:
        ap.error(f"--schedulers must be from {sorted(known)}, got {args.schedulers}")
    if not set(args.settings.split(",")) <= set(SETTINGS):
        ap.error(f"--settings must be from {list(SETTINGS)}, got {args.settings}")
    for name, lo in (("edge_users", 1), ("cohorts", 1), ("threads", 1)):
        if getattr(args, name) < lo:
            ap.error(f"--{name.replace('_', '-')} must be >= {lo}, got {getattr(args, name)}")
    check_ranges(ap, args)  # rounds, users, tokens, deadlines, RTTs: as the load generator checks them
    if not 0 < args.alpha < 1 or not args.window_s > 0:
        ap.error("--alpha must be in (0, 1) and --window-s > 0")
    check_planning_profile_args(ap, args)
    if args.pin_cpus == "on" and len(available_cpus()) < 2 and args.resimulate is None:  # a re-simulation pins nothing
        ap.error(f"--pin-cpus on needs 2 CPUs this process may use, got {sorted(available_cpus())}")
    if args.profile != AUTO:
        try:
            forced = load_profile(args.profile)  # a bad name fails before anything starts
        except ProfileError as exc:
            ap.error(f"--profile: {exc}")
        if forced.edge is None or forced.network is None:
            ap.error(f"--profile must name a split profile (edge and network sections, e.g. split_cpu1_specsched-pair), got {args.profile}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.resimulate is not None:
        resimulate(args)
        return
    import torch

    from runtime.pair import CODE_PROMPTS, PROSE_PROMPTS, build_pair, load_pair
    from runtime.split_placement import EdgeUser

    torch.set_num_threads(args.threads)
    pair_path = args.pair or build_pair(progress=False)
    pair = load_pair(pair_path)
    planning = resolve_profile(args.profile, pair=pair, threads=args.threads, auto=args.auto_profile, refresh=args.remeasure_profile,
                               base=default_split_base(args.threads), edge_here=True)
    print(planning.describe(), flush=True)
    profile = str(planning.path)
    tok = pair.tokenizer
    prompts = CODE_PROMPTS + PROSE_PROMPTS
    frames = []
    load = [os.getloadavg()[0]]  # the host's 1-minute load average, before and after the live part
    server_cpus, before = None, available_cpus()
    if args.pin_cpus == "on":  # after the calibration, which measured on whichever core was free
        first, second = sorted(available_cpus())[:2]
        server_cpus = {first}
        pin_process({second})
    probes: list[str] = []  # each scheduler's link probes: stack ms per round trip, per edge user
    t_start = time.perf_counter()
    try:
        for scheduler in args.schedulers.split(","):
            proc, url, address = start_server(scheduler, pair_path, profile, args.window_s, args.alpha, args.cohorts, args.threads,
                                              args.policy if scheduler == "policy" else None, server_cpus, args.device_sharing)
            edges = [EdgeUser(address, pair.draft, eos_id=tok.eos_id, seed=i, rtt_report=args.rtt_report) for i in range(args.edge_users)]
            try:
                if args.rtt_report == "measured":  # not a round: the probe's requests are neither planned nor counted
                    stack = probe_links(edges, tok, prompts, sum(args.rtt_ms) / 2e3)
                    probes.append(f"{scheduler} " + ", ".join(f"{ms:.2f}" for ms in stack))
                    print(f"[{scheduler} probe] stack ms per round trip: " + ", ".join(f"{ms:.2f}" for ms in stack), flush=True)
                for setting in args.settings.split(","):
                    rng = np.random.default_rng([args.seed, SETTINGS.index(setting)])  # the same users for every scheduler
                    for r in range(args.rounds):
                        users = draw_round(rng, r, args.edge_users, args.http_users if setting == "mix" else 0, tuple(args.tokens), tuple(args.deadline_s),
                                           tuple(args.rtt_ms), prompts, setting)
                        alpha = float(httpx.get(f"{url}/health", timeout=10).json()["alpha_estimate"])
                        run_round(users, edges, url, tok)
                        frames.append(pd.DataFrame(users).assign(scheduler=scheduler, alpha_server=alpha))
                        print(f"[{scheduler} {setting} round {r}] " + ", ".join(f"{u['kind']}:{u['mode']}/{u['outcome']}/{u['latency_s']:.2f}s" for u in users), flush=True)
            finally:
                for e in edges:
                    e.close()
                proc.terminate()
                proc.wait(timeout=60)
    finally:
        if server_cpus is not None:  # the CPUs this process had (a caller, a test, goes on after main)
            pin_process(before)
    wall = time.perf_counter() - t_start
    load.append(os.getloadavg()[0])
    sims = [simulate(df, s, profile, args.window_s, args.policy, args.completion, args.sim_rtt) for s, df in pd.concat(frames, ignore_index=True).groupby("scheduler", sort=False)]
    both = pd.concat(sims)
    live = [
        f"**Planning profile** ({planning.source}; `--profile {args.profile}`): " + "; ".join(f"{k}: {v}" for k, v in planning.summary().items()
                                                                                        if k not in ("engine overhead",)) + ".",
        f"Wall time of the live part: {wall:.0f} s; the host's 1-minute load average {load[0]:.1f} before it and {load[1]:.1f} after, "
        f"on {os.cpu_count()} CPU(s) (above the CPU count the host was loaded, and real times are slower than the profile's).",
        *([f"Link probes (stack ms per round trip beyond the emulated RTT, per edge user, before each server's first round): {'; '.join(probes)}."]
          if probes else []),
        f"Reproduce: `{command(args)}`",
    ]
    write_report(args, both.drop(columns=["prompt"]), compare(both), live, planning.path.read_text(), planning.path.name)


if __name__ == "__main__":
    main()
