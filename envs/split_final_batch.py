"""The v1 vector env's final ``info`` of many ended rounds at once (issue #13).

Every sub-env of a vector env ends its round on the same step (every round has ``K`` users), and
:func:`envs.edge_schedule_v1.final_info` -- one ``evaluate_split_plan`` per round, a few dozen
small numpy calls each -- then cost about a third of the vector env's time. :func:`final_infos`
computes the same numbers for all of them with (T, K) arrays, by the operations of the one-round
path in their order: each batch's time by the cost model's array forms (``CostModel.ad_time``,
``sd_time``, ``envs.split_plan.ed_time``: the forms ``evaluate_plan`` calls, and whose operations the
``*_time1`` floats of ``evaluate_split_plan`` repeat), its end at its fixed share, each user's latency
``U + end + downlink`` (ED: ``U_E + end + P_E + J X_E``). It covers the paper's outcome model
(``completion="batch"``, ``sharing="fixed"``, expected acceptance) on rounds whose realised outputs
and acceptance equal the predictions of their ED users' constants; other rounds go through
``final_info`` one at a time (:func:`batchable`). ``tests/test_v1_reset_batch.py`` compares both.
"""

from __future__ import annotations

import numpy as np

from envs.config import EnvConfig
from envs.cost_model import CostModel, sd_iterations
from envs.plan import AD, ED, SD
from envs.split_plan import ed_time

#: what :func:`final_infos` returns per round, the vector env's final ``info`` keys
KEYS = ("served", "admitted_ad", "admitted_sd", "admitted_ed", "rejected", "late", "gamma", "z", "ed_share", "lam")


def batchable(cfg: EnvConfig) -> bool:
    """Whether ``cfg``'s outcome model is the one :func:`final_infos` computes."""
    return not cfg.simulate_acceptance and cfg.completion == "batch" and cfg.sharing == "fixed"


def _max(values: np.ndarray, member: np.ndarray) -> np.ndarray:
    """Per row, the largest of ``values`` (all >= 0) over ``member`` (0 for a row without members:
    its batch is empty, and nothing reads it)."""
    return np.where(member, values, 0).max(axis=1)


def final_infos(cost: CostModel, inp: np.ndarray, out: np.ndarray, alpha: np.ndarray, up: np.ndarray, down: np.ndarray, deadline: np.ndarray,
                modes: np.ndarray, depth: np.ndarray, gamma: np.ndarray, shares: np.ndarray, ed_j: np.ndarray, ed_x: np.ndarray,
                prefill: np.ndarray) -> dict[str, np.ndarray]:
    """The final ``info`` numbers (:data:`KEYS`) of T ended rounds.

    Per round and user (T, K), in any one user order per round: inputs, **realised** outputs and
    acceptance, uplink, **realised** downlink, deadline, mode and ED depth; per round (T,): SD depth
    (0 = none) and ``shares`` (T, 3) = ``(z, ed_share, lam)``; the ED users' constants ``ed_j`` /
    ``ed_x`` (T, K, G) and ``prefill`` (T, K) in the same user order.
    """
    latency = outcome_latency(cost, inp, out, alpha, up, down, modes, depth, gamma, shares, ed_j, ed_x, prefill)
    served = (np.isfinite(latency) & (latency <= deadline * (1 + 1e-9))).sum(axis=1)
    counts = [(modes == m).sum(axis=1) for m in (AD, SD, ED)]
    admitted = counts[0] + counts[1] + counts[2]
    return {"served": served, "admitted_ad": counts[0], "admitted_sd": counts[1], "admitted_ed": counts[2], "rejected": modes.shape[1] - admitted,
            "late": admitted - served, "gamma": gamma, "z": shares[:, 0], "ed_share": shares[:, 1], "lam": shares[:, 2]}


def outcome_latency(cost: CostModel, inp: np.ndarray, out: np.ndarray, alpha: np.ndarray, up: np.ndarray, down: np.ndarray, modes: np.ndarray,
                    depth: np.ndarray, gamma: np.ndarray, shares: np.ndarray, ed_j: np.ndarray, ed_x: np.ndarray, prefill: np.ndarray) -> np.ndarray:
    """(T, K) realised latency of every user (inf if rejected): ``evaluate_split_plan(...).latency_s``
    of each round (:func:`final_infos`' arguments)."""
    t, k = modes.shape
    ad, sd, ed = modes == AD, modes == SD, modes == ED
    n_ad, n_sd, n_ed = ad.sum(axis=1), sd.sum(axis=1), ed.sum(axis=1)
    z, e_share = shares[:, 0], shares[:, 1]
    latency = np.full((t, k), np.inf)
    # AD at share z, finishing at its batch's end (evaluate_plan; evaluate_split_plan's _fixed_share_finish)
    total = cost.ad_time(n_ad, _max(inp, ad), _max(out, ad))
    end = np.where(z > 0, total / np.where(z > 0, z, 1.0), np.inf)
    latency = np.where(ad, (_max(up, ad) + end)[:, None] + down, latency)
    # SD at 1 - z - ed_share, J from the realised output and acceptance at the round's depth (one
    # sd_iterations call per depth: its arithmetic with a scalar depth, as the one-round path calls it)
    g = np.maximum(gamma, 1)
    j = np.zeros((t, k), dtype=np.int64)
    for depth_value in np.unique(g[n_sd > 0]).tolist():
        rows = g == depth_value
        j[rows] = sd_iterations(out[rows], alpha[rows], depth_value)
    total = cost.sd_time(n_sd, _max(inp, sd), _max(out, sd), _max(j, sd), g)
    share = np.where(n_ed > 0, 1.0 - (z + e_share), 1.0 - z)  # evaluate_split_plan's with ED users, evaluate_plan's without (equal when ed_share is 0)
    end = np.where(share > 0, total / np.where(share > 0, share, 1.0), np.inf)
    latency = np.where(sd, (_max(up, sd) + end)[:, None] + down, latency)
    # ED: U_E + C_E / zeta_E + P_E + J X_E (no downlink), J and X at each ED user's own depth
    col = np.maximum(depth, 1)[..., None] - 1
    j_e = np.take_along_axis(ed_j, col, axis=2)[..., 0]
    x_e = np.take_along_axis(ed_x, col, axis=2)[..., 0]
    j_max = _max(j_e, ed)
    c_e = ed_time(cost, n_ed, _max(inp, ed), _max(out, ed), j_max, _max(depth, ed) + 1)
    end = np.where(e_share > 0, c_e / np.where(e_share > 0, e_share, 1.0), np.inf)
    lat_e = _max(up, ed) + end + _max(prefill, ed) + j_max * _max(x_e, ed)
    latency = np.where(ed, lat_e[:, None], latency)
    return latency
