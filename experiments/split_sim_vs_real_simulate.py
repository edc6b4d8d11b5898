"""The simulator side of ``experiments.split_sim_vs_real``: the rounds the split server saw, planned
and costed again with the v1 model, and their comparison with the live records.

:func:`simulate` rebuilds each live round as the server built it and costs its plan with
``envs.split_outcome.evaluate_split_plan``; :func:`ed_iteration_parts` gives the model's parts of an ED
iteration beside the edges' logged ones; :func:`compare` and :func:`compare_parts` tabulate real
against simulated. Separate from the experiment's driver (:mod:`experiments.split_sim_vs_real`: the
server, the edges, the CLI, ``--resimulate`` and the report), as ``experiments.sim_vs_real_simulate``
is from v0's: it needs no server and no model pair, only the rows the load generator recorded.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from agents.ed_batch import split_model
from agents.registry import make_scheduler
from envs.config import EnvConfig
from envs.cost_model import CostModel
from envs.draft_tree import DraftTree
from envs.plan import AD, ED, SD
from envs.profile import load_profile
from envs.split_outcome import evaluate_split_plan
from envs.split_plan import ed_users
from envs.workload import Round

MODES = {AD: "ad", SD: "sd", ED: "ed"}
#: (report label, column prefix) of the simulated figures compared with the live ones
SIMS = (("sim", "sim"), ("sim, measured acceptance", "sim_measured"), ("sim, batch completion", "sim_batch"))


#: which round trip the simulator plans edge users with: what they reported to the server, or the emulated RTT alone (an ablation)
SIM_RTTS = ("reported", "emulated")


def simulate(df: pd.DataFrame, scheduler: str, profile: str, window_s: float, policy: str | None, completion: str = "own",
             sim_rtt: str = "reported") -> pd.DataFrame:
    """Plan each round as the server saw it and cost it with the v1 model (see the module docstring).

    ``completion``: when users end in *sim* and *sim, measured acceptance* -- ``own`` (each at its own
    last token: ``completion`` and ``ed_completion`` of ``envs.split_outcome.evaluate_split_plan``) or
    ``batch``; *sim_batch* (the estimate realised, every user ending at its batch's end) is always added.
    ``sim_rtt``: ``reported`` (the round trip each edge user reported, :func:`reported_rtt_s`: as the
    server saw it) or ``emulated`` (the emulated RTT alone, ``rtt_s``: an ablation that shows what the
    measured stack time adds; the plans then pick depths for the shorter RTT, so they may differ from
    the server's)."""
    if sim_rtt not in SIM_RTTS:
        raise ValueError(f"sim_rtt must be one of {list(SIM_RTTS)}, got {sim_rtt!r}")
    cost = CostModel(load_profile(profile))
    split = split_model(cost.profile)
    sched = make_scheduler(scheduler, cost, EnvConfig.max_gamma, seed=0) if scheduler != "policy" else _policy(cost, policy)
    rows = []
    for _, g in df.groupby(["setting", "round"], sort=False):
        n = len(g)
        edge = (g.kind == "edge").to_numpy()
        rnd = Round.from_requests(g.prompt_tokens.to_numpy(), g.max_tokens.to_numpy(), np.maximum(g.deadline_s.to_numpy() - window_s, 1e-6),
                                  np.full(n, float(g.alpha_server.iloc[0])), uplink_s=0.0, downlink_s=0.0)
        rnd.has_edge, rnd.rtt_s = edge, reported_rtt_s(g) if sim_rtt == "reported" else g.rtt_s.to_numpy(dtype=float)
        plan = sched.plan(rnd)
        produced = np.maximum(g.tokens.fillna(0).to_numpy(dtype=np.int64), 1)
        realised = np.where(g.outcome.isin(["served", "late"]), produced, rnd.output_tokens)  # a rejected request's output is never seen
        acc, rej = g.accepted.to_numpy(dtype=float), g.rejections.to_numpy(dtype=float)
        with np.errstate(invalid="ignore", divide="ignore"):
            measured = np.clip(acc / (acc + rej), 0.0, 0.999)
        outs, realised_rounds = {}, {}
        for label, alpha, ends in (("sim", rnd.alpha, completion), ("sim_measured", np.where(np.isfinite(measured), measured, rnd.alpha), completion),
                                   ("sim_batch", rnd.alpha, "batch")):
            rr = realised_rounds[label] = dataclasses.replace(rnd, realized_output_tokens=realised.astype(np.int64), realized_alpha=np.asarray(alpha, dtype=float))
            outs[label] = evaluate_split_plan(cost, split, rr, plan, completion=ends, ed_completion=ends)
        parts = ed_iteration_parts(cost, split, realised_rounds["sim"], plan)  # the estimate realised, as *sim*
        for k, idx in enumerate(g.index):
            row = {"index": idx, "sim_mode": MODES.get(int(plan.modes[k]), "-"), "sim_depth": int(plan.ed_depth[k]) if plan.ed_depth is not None and plan.modes[k] == ED else 0}
            for label, out in outs.items():
                lat = float(out.latency_s[k])
                row[f"{label}_served"] = bool(out.served[k])
                row[f"{label}_latency_s"] = lat + window_s if np.isfinite(lat) else np.nan
            row.update({f"sim_{name}": float(v[k]) for name, v in parts.items()})
            rows.append(row)
    return df.join(pd.DataFrame(rows).set_index("index"))


def reported_rtt_s(g: pd.DataFrame) -> np.ndarray:
    """Each user's round trip as the server saw it, s: the RTT the edge reported (``reported_rtt_s``:
    the emulated RTT plus its measured stack time, ``runtime.split.rtt_estimate``) where the records
    have it, else the emulated ``rtt_s`` (runs before stop 43, and ``--rtt-report link``)."""
    rtt = g.rtt_s.to_numpy(dtype=float)
    if "reported_rtt_s" not in g.columns:
        return rtt
    reported = g.reported_rtt_s.to_numpy(dtype=float)
    return np.where(np.isfinite(reported), reported, rtt)


def ed_iteration_parts(cost: CostModel, split, rnd: Round, plan) -> dict[str, np.ndarray]:
    """Per user (NaN unless in ED), the v1 model's parts of an ED request's iterations in ms -- the
    mean per iteration with the prompt's prefill spread over them, as the edges' logs average them
    (``runtime.split_loadgen.ITERATION_PARTS``: a request's first iteration carries the server's and
    the edge's prefill) -- over its own ``J_k`` iterations (``envs.split_outcome``'s terms):

    * ``draft_ms``: ``(P_k + J_k * draft_k) / J_k``, ``draft_k`` the edge's chain at its depth (no
      proactive reuse; the model's in-flight proactive delay, part of ``X_k``, is left out: on this
      testbed's loopback it is a fraction of a ms);
    * ``network_ms``: the round trip of its own RTT and message bytes;
    * ``verify_ms``: ``(tau_L(b, S, S) + J_k tau_L(b, q, c + q)) / (J_k zeta_E)``: the ED batch's
      prefill and one verify pass per iteration (all ``b`` ED users, ``q = max g + 1``, ``c = S + N /
      2``) at the ED share. Live, the cohorts' passes are separate and the queue wait is its own part.
    """
    n = rnd.num_users
    parts = {name: np.full(n, np.nan) for name in ("draft_ms", "network_ms", "verify_ms")}
    ed = np.flatnonzero(plan.modes == ED)
    if ed.size == 0 or plan.ed_share <= 0:
        return parts
    depth = plan.ed_depth[ed]
    users = ed_users(split, rnd, int(depth.max()), realised=True)
    b, q = ed.size, float(depth.max() + 1)
    s_max = max(float(rnd.input_tokens[ed].max()), 1.0)
    context = s_max + float(rnd.realized_output_tokens[ed].max()) / 2.0
    prefill_s, pass_s = cost.tau_l.tau1(b, s_max, s_max), cost.tau_l.tau1(b, q, context + q)
    for k, g in zip(ed.tolist(), depth.tolist(), strict=True):
        chain = DraftTree.chain(int(g))
        j = float(users.iterations[k, g - 1])
        own_context = float(rnd.input_tokens[k]) + float(rnd.realized_output_tokens[k]) / 2.0
        draft_s = split.edge_draft_s(float(rnd.alpha[k]), chain, own_context)
        parts["draft_ms"][k] = 1e3 * (float(users.prefill_s[k]) + j * draft_s) / j
        parts["network_ms"][k] = 1e3 * split.network_s(chain, float(rnd.rtt_s[k]))
        parts["verify_ms"][k] = 1e3 * (prefill_s + j * pass_s) / (j * plan.ed_share)
    return parts


def compare_parts(df: pd.DataFrame) -> pd.DataFrame:
    """Per scheduler and setting, ED users' (ED live and simulated, with the model's parts) mean ms per
    iteration of each part, prefill spread over the iterations, live (the edges' logs) and simulated
    (:func:`ed_iteration_parts`); empty for runs recorded before the logs' parts were kept."""
    if not {"draft_ms", "verify_ms", "queue_ms", "network_ms"} <= set(df.columns):
        return pd.DataFrame()
    rows = []
    for (scheduler, setting), g in df.groupby(["scheduler", "setting"], sort=False):
        m = g[(g["mode"] == "ed") & (g.sim_mode == "ed") & g.outcome.isin(["served", "late"]) & g.sim_verify_ms.notna()]
        if m.empty:
            continue
        rows.append({"scheduler": scheduler, "setting": setting, "ED users": len(m),
                     "draft ms (real)": m.draft_ms.mean(), "draft ms (sim)": m.sim_draft_ms.mean(),
                     "network ms (real)": m.network_ms.mean(), "network ms (sim)": m.sim_network_ms.mean(),
                     "verify ms (real)": m.verify_ms.mean(), "queue ms (real)": m.queue_ms.mean(), "verify ms (sim, at the ED share)": m.sim_verify_ms.mean()})
    return pd.DataFrame(rows)


def _policy(cost: CostModel, path: str | None):
    from agents.policy_v1 import PolicyV1Scheduler

    return PolicyV1Scheduler(cost, EnvConfig.max_gamma, seed=0, path=path)


def _err(sim: float, real: float) -> float:
    return (sim - real) / real * 100 if real and np.isfinite(real) and np.isfinite(sim) else np.nan


def compare(df: pd.DataFrame) -> pd.DataFrame:
    """Per scheduler, setting and population (ED users in both / everyone): served and p50 latency errors."""
    rows = []
    for (scheduler, setting), g in df.groupby(["scheduler", "setting"], sort=False):
        for who, m in (("ED users", g[(g["mode"] == "ed") & (g.sim_mode == "ed")]), ("edge users", g[g.kind == "edge"]), ("everyone", g)):
            if m.empty:
                continue
            done = m.outcome.isin(["served", "late"])
            real_served, real_p50 = int((m.outcome == "served").sum()), m.latency_s[done].median()
            row = {"scheduler": scheduler, "setting": setting, "users": who, "requests": len(m), "served (real)": real_served}
            for label, col in SIMS:
                served = int(m[f"{col}_served"].sum())
                row[f"served ({label})"] = served
                row[f"served error % ({label})"] = (served - real_served) / max(real_served, 1) * 100
            row["p50 latency real (s)"] = real_p50
            for label, col in SIMS:
                p50 = m[f"{col}_latency_s"].dropna().median()
                row[f"p50 ({label}) (s)"] = p50
                row[f"p50 error % ({label})"] = _err(p50, real_p50)
            row["same modes (%)"] = float((m["mode"].fillna("-").replace({"rejected": "-", "error": "-"}) == m.sim_mode).mean() * 100)
            rows.append(row)
    return pd.DataFrame(rows)
