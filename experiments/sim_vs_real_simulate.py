"""The simulator side of ``experiments.sim_vs_real``: the rounds the server saw, planned and costed again.

:func:`simulate` rebuilds each live round as the server built it (prompt tokens, ``max_tokens`` as
the output prediction, the deadline less the round window, the acceptance estimate the server
planned with), plans it with the same scheduler on the same profile -- scaled by the server's
online calibration where it had one -- and costs the plan with ``envs.outcome`` under the chosen
sharing model; :func:`prefill_s` gives each user's simulated time to its first token.

Separate from the experiment's driver (:mod:`experiments.sim_vs_real`: the server, the load
generator, the CLI) and its report (:mod:`experiments.sim_vs_real_report`): it needs no server and
no model pair, only the rows the load generator recorded (what ``--from-csv`` re-simulates).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from agents.registry import make_scheduler
from envs.config import EnvConfig
from envs.cost_model import CostModel
from envs.outcome import evaluate_plan
from envs.plan import AD, SD
from envs.profile import load_profile
from envs.workload import Round
from runtime.calibration import CalibratedCostModel, StepCalibration

#: the simulator's default sharing model: the executor's whole-step rule (see the module docstring)
DEFAULT_SHARING = "steps"


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


