"""Training speed on a busy machine, as a ratio to the idle run in the same process.

    python -m experiments.bench.train_speed [--timesteps 8192] [--repeats 3] [--hogs 2] [--threads 1] [--publish]

Trains the README's command (MaskablePPO, K = 12, 16 envs; no evaluation or export) for
``--timesteps`` decisions, in this process, with ``threads`` torch threads (default 1, the
training default), **idle** and with ``--hogs`` CPU-bound processes beside it, placed two ways:

* ``other sessions`` -- each hog in its own session, as another user's job or another Slurm job
  is: Linux's scheduler (with autogroups, the default on desktops and many servers) shares the
  CPU between sessions first;
* ``this session`` -- hogs started from the trainer's own session (e.g. the same shell), which
  then share this session's part of the CPU with the trainer.

The hogs are started and stopped by the benchmark (each also exits by itself after a bounded
time). Cases alternate and each is repeated ``--repeats`` times; medians are reported, with the
ratio to the idle run of the same thread count, the decisions per CPU-second of this process
(what it does with the CPU it gets: threads spinning against neighbours waste it) and its CPU
share. Target (issue 10, section 8): with two hogs, ``threads = 1`` keeps >= 50 % of its idle speed.

"Idle" means no hogs of ours: other load on a shared machine shows in the load average printed
with the results.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from agents.artefacts import write_text_atomic
from agents.train import train

ROOT = Path(__file__).resolve().parents[2]
HOG = "import time\nend = time.monotonic() + {limit}\nwhile time.monotonic() < end:\n    pass\n"


PLACEMENTS = ("other sessions", "this session")


@contextlib.contextmanager
def cpu_hogs(n: int, limit_s: float, own_session: bool = True):
    """``n`` busy-looping processes for the duration of the block (each exits by itself after ``limit_s``).

    ``own_session``: each hog in a new session (``setsid``), like another user's process.
    """
    procs = [subprocess.Popen([sys.executable, "-c", HOG.format(limit=limit_s)], start_new_session=own_session) for _ in range(n)]
    try:
        time.sleep(0.5 if n else 0.0)  # let them reach the loop
        yield procs
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def decisions_per_s(timesteps: int, threads: int, seed: int = 0) -> float:
    """Training decisions/s of the README command (K = 12) for ``timesteps``, with ``threads`` torch threads."""
    return train_rates(timesteps, threads, seed)[0]


def train_rates(timesteps: int, threads: int, seed: int = 0) -> tuple[float, float, float]:
    """One training run: (decisions per wall second of ``learn``, decisions per CPU-second of this
    process over the whole run, CPU share = CPU-seconds per wall second over the whole run)."""
    cpu0, wall0 = time.process_time(), time.perf_counter()
    summary = _train(timesteps, threads, seed)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return float(summary["steps_per_s"]), summary["trained_timesteps"] / max(cpu, 1e-9), cpu / max(wall, 1e-9)


def _train(timesteps: int, threads: int, seed: int) -> dict:
    overrides = [
        "agent=maskable_ppo", "env.num_users=12", f"total_timesteps={timesteps}", "logger=disabled", f"threads={threads}",
        "eval.rounds=1", "eval.freq=0", "eval.final_rounds=0", "checkpoint_freq=0", "export_onnx=false", "progress_bar=false", f"seed={seed}",
    ]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        raw = OmegaConf.to_container(compose(config_name="train", overrides=overrides), resolve=True)
    with tempfile.TemporaryDirectory() as out, contextlib.redirect_stdout(io.StringIO()):
        return train(raw, out)


def measure(timesteps: int, repeats: int, hogs: int, thread_counts: list[int]) -> list[dict]:
    limit_s = 900.0
    cases = [(threads, place) for threads in thread_counts for place in ("idle", *PLACEMENTS)]
    samples: dict[tuple[int, str], list[tuple[float, float, float]]] = {c: [] for c in cases}
    _train(2048, 1, 0)  # warm-up: imports, first torch work
    for rep in range(repeats):
        for threads, place in cases if rep % 2 == 0 else cases[::-1]:  # alternate to spread drift in background load
            with cpu_hogs(0 if place == "idle" else hogs, limit_s, own_session=place == "other sessions"):
                samples[(threads, place)].append(train_rates(timesteps, threads, seed=rep))
            wall, cpu, share = samples[(threads, place)][-1]
            print(f"[train_speed] threads={threads} hogs={place}: {wall:,.0f} decisions/s, {cpu:,.0f} per CPU-second, {share:.2f} cores", flush=True)
    rows = []
    for threads in thread_counts:
        idle = [_median(samples[(threads, "idle")], i) for i in range(3)]
        for place in ("idle", *PLACEMENTS):
            wall, cpu, share = (_median(samples[(threads, place)], i) for i in range(3))
            rows.append({"threads": threads, "hogs": "none" if place == "idle" else f"{hogs}, {place}", "place": place, "decisions_per_s": wall,
                         "ratio_to_idle": wall / idle[0], "per_cpu_s": cpu, "cpu_ratio_to_idle": cpu / idle[1], "cpu_share": share,
                         "samples": [w for w, _, _ in samples[(threads, place)]]})
    return rows


def _median(samples: list[tuple[float, ...]], i: int) -> float:
    vals = sorted(p[i] for p in samples)
    return vals[len(vals) // 2]


def markdown(rows: list[dict], args: argparse.Namespace, load_before: tuple[float, float, float], seconds: float) -> str:
    lines = [
        "# Training speed on a busy machine",
        "",
        f"MaskablePPO, K = 12, 16 envs (the README command), {args.timesteps:,} decisions per measurement, median of {args.repeats}; "
        f"CPU hogs = busy-looping processes started by the benchmark at its own priority, in their own sessions (as other users' "
        f"jobs are) or in the trainer's session. {os.cpu_count()} CPU cores; load average before: "
        f"{load_before[0]:.2f} / {load_before[1]:.2f} / {load_before[2]:.2f} (1 / 5 / 15 min).",
        "",
        "| torch threads | CPU hogs | decisions/s | ratio to idle | decisions per CPU-second | ratio to idle | CPU share (cores) | samples (decisions/s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['threads']} | {r['hogs']} | {r['decisions_per_s']:,.0f} | {r['ratio_to_idle']:.2f} | {r['per_cpu_s']:,.0f} | "
                     f"{r['cpu_ratio_to_idle']:.2f} | {r['cpu_share']:.2f} | {', '.join(f'{v:,.0f}' for v in r['samples'])} |")
    other = next(r for r in rows if r["threads"] == 1 and r["place"] == "other sessions")
    same = next(r for r in rows if r["threads"] == 1 and r["place"] == "this session")
    verdict = "meets" if other["ratio_to_idle"] >= 0.5 else "misses"
    lines += [
        "",
        f"Target: `threads: 1` (the default) keeps >= 50 % of its idle speed with {args.hogs} CPU hogs beside it. With the hogs in "
        f"other sessions it keeps {other['ratio_to_idle']:.0%} ({verdict} the target); it loses no efficiency "
        f"({other['cpu_ratio_to_idle']:.0%} of its decisions per CPU-second). Hogs started from the trainer's own session take "
        f"that session's CPU: {same['ratio_to_idle']:.0%} of the idle speed, at {same['cpu_ratio_to_idle']:.0%} of its efficiency "
        f"-- the loss is CPU time the OS gives the hogs, not work wasted by the trainer.",
        "",
        f"Reproduce: `python -m experiments.bench.train_speed --timesteps {args.timesteps} --repeats {args.repeats} --hogs {args.hogs}"
        f"{' --threads ' + args.threads if args.threads else ''} --publish` ({seconds:.0f} s here).",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--timesteps", type=int, default=8192, help="decisions per measurement (rounded up to whole rollouts of 4,096)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--hogs", type=int, default=2)
    ap.add_argument("--threads", type=str, default=None, help="thread counts to compare, e.g. 1,2 (default: 1; more threads beside hogs is very slow)")
    ap.add_argument("--publish", action="store_true", help="write results/train_speed.md")
    args = ap.parse_args(argv)
    if args.timesteps < 1 or args.repeats < 1 or args.hogs < 1:
        ap.error(f"--timesteps, --repeats and --hogs must be >= 1, got {args.timesteps}, {args.repeats}, {args.hogs}")
    try:
        thread_counts = sorted({int(t) for t in args.threads.split(",")}) if args.threads else [1]
    except ValueError:
        ap.error(f"--threads must be comma-separated integers, got {args.threads!r}")
    if min(thread_counts) < 1:
        ap.error(f"--threads must be >= 1, got {thread_counts}")
    if 1 not in thread_counts:
        thread_counts = [1, *thread_counts]
    load_before = os.getloadavg()
    start = time.perf_counter()
    rows = measure(args.timesteps, args.repeats, args.hogs, thread_counts)
    text = markdown(rows, args, load_before, time.perf_counter() - start)
    print(text)
    if args.publish:
        write_text_atomic(ROOT / "results" / "train_speed.md", text)


if __name__ == "__main__":
    main()
