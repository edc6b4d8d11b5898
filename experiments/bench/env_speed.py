"""Environment speed, as ratios to Gymnasium's CartPole-v1 measured in the same process.

    python -m experiments.bench.env_speed [--users 50] [--num-envs 1024] [--seconds 2]

Prints steps/s of the scalar ``EdgeSchedule-v0`` (``step`` alone and ``step`` + ``action_masks``,
through ``gymnasium.make``'s wrappers like CartPole) and user-decisions/s of the numpy vector env
on one core. Targets (issue #2): a scalar step costs <= 3x a CartPole step; the vector env makes
>= 100,000 user-decisions/s.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")  # "on one core"

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402

import envs  # noqa: E402


def rate(fn, seconds: float) -> float:
    """Calls of ``fn`` per second, best of three timed windows (the machine is noisy)."""
    best = 0.0
    for _ in range(3):
        n, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds / 3:
            fn()
            n += 1
        best = max(best, n / elapsed)
    return best


def cartpole_steps_per_s(seconds: float) -> float:
    env = gym.make("CartPole-v1")
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    actions = rng.integers(0, 2, size=1 << 16)
    i = 0

    def step():
        nonlocal i
        _, _, term, trunc, _ = env.step(int(actions[i & 0xFFFF]))
        i += 1
        if term or trunc:
            env.reset()

    return rate(step, seconds)


def edge_steps_per_s(users: int, seconds: float, with_masks: bool) -> float:
    env = gym.make(envs.ENV_ID, num_users=users)
    env.reset(seed=0)
    u = env.unwrapped
    rng = np.random.default_rng(0)
    choices = rng.random(1 << 16)
    i = 0

    def step():
        nonlocal i
        if with_masks:
            m = u.action_masks()
            allowed = np.flatnonzero(m)
            a = int(allowed[int(choices[i & 0xFFFF] * len(allowed))])
        else:
            a = int(choices[i & 0xFFFF] * 10)
        i += 1
        _, _, term, _, _ = env.step(a)
        if term:
            env.reset()

    return rate(step, seconds)


def vector_decisions_per_s(users: int, num_envs: int, seconds: float) -> float:
    venv = gym.make_vec(envs.ENV_ID, num_envs=num_envs, vectorization_mode="vector_entry_point", num_users=users)
    venv.reset(seed=0)
    u = venv.unwrapped
    rng = np.random.default_rng(0)

    def step():
        m = u.action_masks()
        # a masked random policy: pick uniformly among allowed actions in every sub-env
        scores = rng.random(m.shape) * m
        venv.step(scores.argmax(axis=1))

    return rate(step, seconds) * num_envs


MAX_SECONDS = 3600.0  #: per measurement
MAX_NUM_ENVS = 1 << 16  #: a vector env's sub-envs (memory grows with them)


def check_speed_args(ap: argparse.ArgumentParser, users: int, num_envs: int, seconds: float, out: str | None, **env_kwargs) -> None:
    """The speed benchmarks' arguments, checked before any measurement (``ap.error`` names the flag)."""
    import math

    from agents.artefacts import check_writable
    from envs.config import ConfigError, EnvConfig

    if not (math.isfinite(seconds) and 0 < seconds <= MAX_SECONDS):
        ap.error(f"--seconds must be a number in (0, {MAX_SECONDS:g}], got {seconds}")
    if not 1 <= num_envs <= MAX_NUM_ENVS:
        ap.error(f"--num-envs must be an integer in [1, {MAX_NUM_ENVS}], got {num_envs}")
    try:
        EnvConfig.from_kwargs(num_users=users, **env_kwargs)
        if out:
            check_writable(out, "--out")
    except (ConfigError, ValueError) as exc:
        ap.error(str(exc).replace("env config field 'num_users'", "--users").replace("env config field 'edge_fraction'", "--edge-fraction"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--users", type=int, default=50)
    ap.add_argument("--num-envs", type=int, default=1024)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--out", default=None, help="also write the table to this markdown file")
    args = ap.parse_args()
    check_speed_args(ap, args.users, args.num_envs, args.seconds, args.out)
    cp = cartpole_steps_per_s(args.seconds)
    plain = edge_steps_per_s(args.users, args.seconds, with_masks=False)
    masked = edge_steps_per_s(args.users, args.seconds, with_masks=True)
    vec = vector_decisions_per_s(args.users, args.num_envs, args.seconds)
    lines = [
        f"| measurement (K={args.users}) | per second | ratio to CartPole-v1 steps/s |",
        "|---|---|---|",
        f"| CartPole-v1 steps (gymnasium.make) | {cp:,.0f} | 1.00 |",
        f"| EdgeSchedule-v0 steps | {plain:,.0f} | {plain / cp:.3f} (a step costs {cp / plain:.1f}x) |",
        f"| EdgeSchedule-v0 steps + action_masks | {masked:,.0f} | {masked / cp:.3f} (costs {cp / masked:.1f}x) |",
        f"| vector env user-decisions, {args.num_envs} envs, 1 core | {vec:,.0f} | {vec / cp:.2f} |",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        from pathlib import Path

        Path(args.out).write_text(text + f"\n\nReproduce: `python -m experiments.bench.env_speed --users {args.users} --num-envs {args.num_envs} --seconds {args.seconds:g}`\n")


if __name__ == "__main__":
    main()
