"""EdgeSchedule-v1 speed, as ratios to Gymnasium's CartPole-v1 measured in the same process.

    python -m experiments.bench.v1_speed [--users 50] [--edge-fraction 0.5] [--num-envs 1024] [--seconds 3] [--repeats 1] [--out FILE.md]

Measures, one core (``OMP_NUM_THREADS=1``), best of three windows each: CartPole-v1 steps/s; the
scalar ``EdgeSchedule-v1`` steps/s through ``gymnasium.make`` (``step`` alone with a fixed action
sequence, and ``step`` + ``action_masks`` with a random masked policy); ``EdgeSchedule-v0`` with the
masked policy for reference; and user-decisions/s of the numpy vector twin (``num_envs`` rounds,
random masked policy). Targets (issue #13): a v1 step costs <= 3x a CartPole step; the vector env
makes >= 100,000 user-decisions/s on one core.

``--repeats R`` runs the whole set R times (on a shared, loaded host the ratios drift with the
load): every rate is then the median over the repeats and every ratio the median of the
per-repeat ratios (each repeat's own CartPole), and the step-cost ratios of each repeat are listed.
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # "on one core"

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402

import envs  # noqa: E402
from agents.artefacts import write_text_atomic  # noqa: E402
from envs.edge_schedule_v1 import V1_DEFAULTS  # noqa: E402
from experiments.bench.env_speed import cartpole_steps_per_s, check_speed_args, rate  # noqa: E402


def scalar_steps_per_s(env_id: str, seconds: float, with_masks: bool, **kwargs) -> float:
    env = gym.make(env_id, **kwargs)
    env.reset(seed=0)
    u = env.unwrapped
    n_actions = env.action_space.n
    choices = np.random.default_rng(0).random(1 << 16)
    i = 0

    def step():
        nonlocal i
        c = choices[i & 0xFFFF]
        i += 1
        if with_masks:
            allowed = np.flatnonzero(u.action_masks())
            a = int(allowed[int(c * len(allowed))])
        else:
            a = int(c * n_actions)
        if env.step(a)[2]:
            env.reset()

    return rate(step, seconds)


def vector_decisions_per_s(num_envs: int, seconds: float, **kwargs) -> float:
    venv = gym.make_vec(envs.V1_ENV_ID, num_envs=num_envs, vectorization_mode="vector_entry_point", **kwargs)
    venv.reset(seed=0)
    u = venv.unwrapped
    rng = np.random.default_rng(0)

    def step():
        m = u.action_masks()
        venv.step((rng.random(m.shape) * m).argmax(axis=1))  # uniform among the allowed actions

    return rate(step, seconds) * num_envs


def measure(args: argparse.Namespace) -> dict[str, float]:
    """One pass over every measurement: name -> rate per second."""
    kw = {"num_users": args.users, "edge_fraction": args.edge_fraction}
    steps = [("CartPole-v1", lambda: cartpole_steps_per_s(args.seconds)),
             ("EdgeSchedule-v1 steps", lambda: scalar_steps_per_s(envs.V1_ENV_ID, args.seconds, False, **kw)),
             ("EdgeSchedule-v1 steps + action_masks", lambda: scalar_steps_per_s(envs.V1_ENV_ID, args.seconds, True, **kw)),
             ("EdgeSchedule-v0 steps + action_masks (same profile)", lambda: scalar_steps_per_s(envs.ENV_ID, args.seconds, True, num_users=args.users,
                                                                                                profile=V1_DEFAULTS["profile"])),
             (f"v1 vector env user-decisions, {args.num_envs} envs", lambda: vector_decisions_per_s(args.num_envs, args.seconds, **kw))]
    results = {}
    for name, fn in steps:
        results[name] = fn()
        print(f"[v1_speed] {name}: {results[name]:,.0f}/s", flush=True)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--users", type=int, default=50)
    ap.add_argument("--edge-fraction", type=float, default=0.5)
    ap.add_argument("--num-envs", type=int, default=1024)
    ap.add_argument("--seconds", type=float, default=3.0, help="per measurement (three windows)")
    ap.add_argument("--repeats", type=int, default=1, help="run the whole set this many times; report medians (loaded hosts)")
    ap.add_argument("--out", default=None, help="also write the table to this markdown file (atomically)")
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error(f"--repeats must be >= 1, got {args.repeats}")
    check_speed_args(ap, args.users, args.num_envs, args.seconds, args.out, edge_fraction=args.edge_fraction)
    load_start = os.getloadavg()[0]
    runs = []
    for r in range(args.repeats):
        if args.repeats > 1:
            print(f"[v1_speed] repeat {r + 1}/{args.repeats}", flush=True)
        runs.append(measure(args))
    names = list(runs[0])
    med = statistics.median
    lines = [f"| measurement (K={args.users}, edge_fraction={args.edge_fraction:g}) | per second | ratio to CartPole-v1 steps/s | a step costs (x CartPole) |",
             "|---|---|---|---|"]
    for name in names:
        value = med(run[name] for run in runs)
        ratio = med(run[name] / run["CartPole-v1"] for run in runs)
        cost = f"{med(run['CartPole-v1'] / run[name] for run in runs):.2f}" if "vector" not in name else "-"
        lines.append(f"| {name} | {value:,.0f} | {ratio:.3f} | {cost} |")
    text = "\n".join(lines)
    if args.repeats > 1:
        text += f"\n\nMedians over {args.repeats} repeats; a step's cost (x CartPole) in each repeat:\n"
        for name in names[1:4]:
            text += f"\n- {name}: " + ", ".join(f"{run['CartPole-v1'] / run[name]:.2f}" for run in runs)
    # the host's load is part of the measurement: ratios taken on a busy machine drift (see --repeats)
    text += f"\n\nHost: {os.cpu_count()} CPUs, 1-minute load average {load_start:.2f} at the start, {os.getloadavg()[0]:.2f} at the end."
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        repeats = f" --repeats {args.repeats}" if args.repeats > 1 else ""
        # the CSV behind the table: every repeat's rates and ratios
        rows = ["measurement,repeat,per_second,ratio_to_cartpole"]
        rows += [f'"{name}",{r},{run[name]:.1f},{run[name] / run["CartPole-v1"]:.6f}' for r, run in enumerate(runs) for name in names]
        write_text_atomic(Path(args.out).with_suffix(".csv"), "\n".join(rows) + "\n")
        write_text_atomic(args.out, text + f"\n\nReproduce: `python -m experiments.bench.v1_speed --users {args.users} --edge-fraction {args.edge_fraction:g} "
                              f"--num-envs {args.num_envs} --seconds {args.seconds:g}{repeats} --out {args.out}`\n")


if __name__ == "__main__":
    main()
