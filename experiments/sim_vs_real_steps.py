"""Where BALANCE's sim-vs-real gap comes from: time-slicing granularity and per-step cost, alone vs shared.

    python -m experiments.sim_vs_real_steps [--csv results/sim_vs_real.csv] [--rounds 3] [--repeats 3]

Reads the rounds of a ``experiments.sim_vs_real`` run (its CSV) and plans every BALANCE round as the
simulator does, on the same planning profile (``--profile auto``: this machine's cached one). Then:

1. **Granularity** (pure model, no clock): each user's compute finish time under the simulator's
   fluid sharing (``envs.outcome``, ``work_conserving``) against its whole-step sharing
   (``sharing="steps"``, :mod:`envs.step_sharing`: the executor's rule, ``runtime.executor.run_shared``:
   whole engine steps, the job with the least ``used / share`` next), both from the *same* cost model. Their difference is what granularity alone
   does: a batch's first step (AD: its whole prefill; SD: both prefills and one iteration) is
   indivisible, so the other batch waits for it instead of progressing at its share.
2. **Per-step cost, alone vs time-sliced** (measured): for the AD batches of the first ``--rounds``
   mixed rounds, prompts of the same lengths (standard-library source) run through ``ad_steps``
   alone and beside the round's SD batch under ``run_shared`` at the plan's ``z``, interleaved,
   ``--repeats`` times (minimum kept). Equal per-step times mean the time-slicing itself adds no
   work (no re-run prefill, no per-slice overhead, no cache penalty).

Writes ``results/sim_vs_real_steps.{csv,md}`` (atomically); the measured part records the load average.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
import pandas as pd

from agents.artefacts import write_csv_atomic, write_text_atomic
from agents.registry import make_scheduler
from envs.config import EnvConfig
from envs.cost_model import CostModel
from envs.outcome import evaluate_plan
from envs.plan import AD, SD
from envs.profile import load_profile
from envs.step_sharing import job_order
from envs.workload import Round

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"


def plan_rounds(df: pd.DataFrame, cost: CostModel, window_s: float, alpha: float) -> list[tuple[int, pd.DataFrame, Round, object]]:
    """BALANCE's plan of every round of ``df`` as ``experiments.sim_vs_real.simulate`` makes it."""
    sched = make_scheduler("balance", cost, EnvConfig.max_gamma, seed=0)
    out = []
    for r, g in df.sort_values(["round", "user"]).groupby("round"):
        planned = g.alpha_planned.dropna() if "alpha_planned" in g else pd.Series(dtype=float)
        a = float(planned.iloc[0]) if len(planned) else alpha
        rnd = Round.from_requests(g.prompt_tokens.to_numpy(), g.max_tokens.to_numpy(), np.maximum(g.deadline_s.to_numpy() - window_s, 1e-6), np.full(len(g), a),
                                  uplink_s=0.0, downlink_s=0.0)
        out.append((int(r), g, rnd, sched.plan(rnd)))
    return out


def granularity(planned, cost: CostModel) -> pd.DataFrame:
    """Per admitted user: fluid vs step-granular compute finish time (s) and its deadline, and the real compute time.

    The rounds have no link time, so an outcome's latency is the compute finish time."""
    rows = []
    for r, g, rnd, plan in planned:
        fluid = evaluate_plan(cost, rnd, plan, completion="own", sharing="work_conserving")
        steps = evaluate_plan(cost, rnd, plan, completion="own", sharing="steps")
        order = job_order(plan.modes)  # rows in the executor's job order, batch by batch
        for m in order:
            for k in np.flatnonzero(plan.modes == m):
                real = g.iloc[k]
                rows.append({"round": r, "mode": "ad" if m == AD else "sd", "mixed": len(order) == 2, "z": float(plan.z), "deadline_s": float(rnd.deadline_s[k]),
                             "fluid_s": float(fluid.latency_s[k]), "steps_s": float(steps.latency_s[k]),
                             "real_s": float(real.latency_s - real.wait_s - real.plan_s) if real.get("mode") in ("ad", "sd") else np.nan})
    return pd.DataFrame(rows)


def measure_slicing(planned, cost: CostModel, rounds: int, repeats: int) -> pd.DataFrame:
    """AD per-step times alone vs beside the SD batch under ``run_shared`` (min over ``repeats``)."""
    import torch

    from runtime.engines import ad_steps, sd_steps
    from runtime.executor import run_shared
    from runtime.pair import build_pair, corpus, load_pair

    torch.set_num_threads(1)
    pair = load_pair(build_pair())
    tok = pair.tokenizer
    text, _ = corpus(max_files=50)
    rng = np.random.default_rng(0)

    def prompts(lengths):
        starts = rng.integers(0, len(text) - 1000, size=len(lengths))
        return [(tok.encode(text[s : s + 2 * n].decode("utf-8", errors="ignore")) or [0])[:n] for s, n in zip(starts, lengths, strict=True)]

    def timed(gen, into: list[float]):
        while True:
            start = time.perf_counter()
            try:
                next(gen)
            except StopIteration as stop:
                into.append(time.perf_counter() - start)
                return stop.value
            into.append(time.perf_counter() - start)
            yield

    rows = []
    mixed = [(r, rnd, plan) for r, _, rnd, plan in planned if (plan.modes == AD).any() and (plan.modes == SD).any()][:rounds]
    for r, rnd, plan in mixed:
        ad_i, sd_i = np.flatnonzero(plan.modes == AD), np.flatnonzero(plan.modes == SD)
        ad_p, sd_p = prompts([int(x) for x in rnd.input_tokens[ad_i]]), prompts([int(x) for x in rnd.input_tokens[sd_i]])
        ad_n, sd_n = [int(x) for x in rnd.output_tokens[ad_i]], [int(x) for x in rnd.output_tokens[sd_i]]
        common = {"pad_id": tok.pad_id, "on_tokens": lambda row, new: None}
        best: dict[str, float] = {}
        for _ in range(repeats):
            alone: list[float] = []
            for _ in timed(ad_steps(pair.target, ad_p, ad_n, **common), alone):
                pass
            shared: list[float] = []
            run_shared({"ad": (timed(ad_steps(pair.target, ad_p, ad_n, **common), shared), max(plan.z, 1e-6)),
                        "sd": (sd_steps(pair.target, pair.draft, sd_p, plan.gamma, sd_n, **common), max(1 - plan.z, 1e-6))})
            for key, v in (("alone prefill (s)", alone[0]), ("shared prefill (s)", shared[0]), ("alone step p50 (ms)", 1e3 * float(np.median(alone[1:]))),
                           ("shared step p50 (ms)", 1e3 * float(np.median(shared[1:]))), ("alone total (s)", sum(alone)), ("shared total (s)", sum(shared))):
                best[key] = min(best.get(key, np.inf), v)
        b, s = len(ad_p), max(len(p) for p in ad_p)
        model_step = np.median([float(cost.tau_l.tau1(b, 1, s + i)) + (float(cost.engine.ad(b)) if cost.engine is not None else 0.0) for i in range(1, max(ad_n))])
        rows.append({"round": r, "AD b": b, "AD padded prompt": s, "AD max output": max(ad_n), "z": float(plan.z), "model prefill (s)": float(cost.tau_l.tau1(b, s, s)),
                     "model step (ms)": 1e3 * float(model_step), "model total (s)": float(cost.ad_time1(b, s, max(ad_n))), **best})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> None:
    from runtime.machine_profile import AUTO, resolve_profile
    from runtime.pair import build_pair

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--csv", type=Path, default=RESULTS / "sim_vs_real.csv", help="a sim_vs_real run's CSV (its balance rows are used)")
    ap.add_argument("--profile", default=AUTO, help="the planning profile (auto: this machine's cached one, as sim_vs_real uses)")
    ap.add_argument("--window-s", type=float, default=0.3)
    ap.add_argument("--alpha", type=float, default=0.9)
    ap.add_argument("--rounds", type=int, default=3, help="mixed rounds to measure alone vs time-sliced (0: none)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    if not args.csv.is_file():
        ap.error(f"--csv: no such file {args.csv} (run experiments.sim_vs_real first)")
    if args.rounds < 0 or args.repeats < 1:
        ap.error("--rounds must be >= 0 and --repeats >= 1")
    df = pd.read_csv(args.csv)
    df = df[(df.scheduler == "balance") & (df.get("calibration", "off") != "on")] if "scheduler" in df else df
    if df.empty:
        ap.error(f"--csv {args.csv} has no balance rows")
    planning = resolve_profile(args.profile, pair=build_pair(), threads=1)
    cost = CostModel(load_profile(planning.path))
    planned = plan_rounds(df, cost, args.window_s, args.alpha)
    gran = granularity(planned, cost)
    summary = []
    for (mixed, mode), q in gran.groupby(["mixed", "mode"]):
        summary.append({"rounds": "mixed" if mixed else "one mode", "mode": mode, "users": len(q), "fluid p50 (s)": q.fluid_s.median(), "steps p50 (s)": q.steps_s.median(),
                        "real p50 (s)": q.real_s.median(), "served fluid": int((q.fluid_s <= q.deadline_s).sum()), "served steps": int((q.steps_s <= q.deadline_s).sum())})
    lines = ["# Sim vs real: time-slicing granularity and per-step cost", "",
             f"BALANCE's rounds from `{args.csv.relative_to(ROOT) if args.csv.is_relative_to(ROOT) else args.csv}`, planned on `{planning.path.name}` ({planning.source}). "
             "Compute finish time per admitted user (from the round's start, window excluded): *fluid* is the simulator's work-conserving sharing, *steps* "
             "emulates `runtime.executor.run_shared` (whole engine steps, least used/share next) with the same cost-model step times; *real* is the run's "
             "latency - wait - planning. Served: finish time within the deadline less the window.", "",
             pd.DataFrame(summary).to_markdown(index=False, floatfmt=".3g"), ""]
    write_csv_atomic(gran, args.out / "sim_vs_real_steps.csv")
    if args.rounds:
        load = os.getloadavg()[0]
        slicing = measure_slicing(planned, cost, args.rounds, args.repeats)
        write_csv_atomic(slicing, args.out / "sim_vs_real_steps_measured.csv")
        lines += [f"AD batches of the first {len(slicing)} mixed rounds, measured alone and time-sliced beside the round's SD batch at the plan's z "
                  f"(1 torch thread, min of {args.repeats}; 1-min load average {load:.1f} on {os.cpu_count()} cores at the start):", "",
                  slicing.to_markdown(index=False, floatfmt=".3g"), ""]
    csv = f"results/{args.csv.name}" if args.csv.resolve().parent == RESULTS else str(args.csv)
    profile = "" if str(args.profile) == AUTO else f" --profile {str(args.profile).replace(str(Path.home()), '~')}"
    lines += [f"Reproduce: `python -m experiments.sim_vs_real_steps --csv {csv}{profile} --rounds {args.rounds} --repeats {args.repeats}`", ""]
    write_text_atomic(args.out / "sim_vs_real_steps.md", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
