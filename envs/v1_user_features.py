"""EdgeSchedule-v1's per-user observation features: v0's eight, then has-an-edge and RTT.

Shared by the scalar env (``envs.edge_schedule_v1``, one round per reset) and the vector env's
batched reset (``envs.split_reset_batch``, many rounds' users at once): the arithmetic is element by
element, so both get the same floats.
"""

from __future__ import annotations

import numpy as np

from envs.config import EnvConfig
from envs.cost_model import expected_tokens_per_iteration
from envs.edge_schedule import UPLINK_SCALE_S
from envs.workload import Round

USER_FEATURES = 10  #: features per user
RTT_SCALE_S = 0.1  #: the RTT feature is rtt / RTT_SCALE_S, clipped to [0, 1]


def round_features(rnd: Round, order: np.ndarray, cfg: EnvConfig) -> np.ndarray:
    """(K, 10) user features in presentation order ``order = rnd.order(cfg.user_order)``: v0's eight, has-an-edge, RTT / 0.1 s.

    The first eight are ``envs.edge_schedule.user_features`` (a reset's hot path: its operations
    element by element, written into one (8, K) block instead of stacked, clipped in place; float32
    casts as astype does). ``tests/test_env_v1_fast_paths.py`` compares the two.
    """
    if cfg.user_order == "arrival":  # order is the identity: the round's arrays as they are (the gathers only copied them)
        inp, out, dl, alpha, slack, up, has, rtt = rnd.input_tokens, rnd.output_tokens, rnd.deadline_s, rnd.alpha, rnd.deadline_s - rnd.downlink_s, rnd.uplink_s, rnd.has_edge, rnd.rtt_s
    else:
        inp, out, dl, alpha, slack, up = (a[order] for a in (rnd.input_tokens, rnd.output_tokens, rnd.deadline_s, rnd.alpha, rnd.deadline_s - rnd.downlink_s, rnd.uplink_s))
        has = None if rnd.has_edge is None else rnd.has_edge[order]
        rtt = None if rnd.rtt_s is None else rnd.rtt_s[order]
    return user_feature_table(inp, out, dl, alpha, slack, up, has, rtt, cfg)


def user_feature_table(inp: np.ndarray, out: np.ndarray, dl: np.ndarray, alpha: np.ndarray, slack: np.ndarray, up: np.ndarray,
                       has: np.ndarray | None, rtt: np.ndarray | None, cfg: EnvConfig) -> np.ndarray:
    """(K, 10) float32 features of users given as (K,) arrays (:func:`round_features`' arithmetic, element
    by element, so the users of several rounds concatenated get their rounds' rows: the vector env's
    batched reset, ``envs.split_reset_batch``). ``has`` / ``rtt`` None: no edge (features 0)."""
    k = len(inp)
    v0 = np.empty((8, k))
    v0[0] = inp / cfg.input_tokens[1]
    v0[1] = out / cfg.output_tokens[1]
    v0[2] = dl / cfg.deadline_s[1]
    v0[3] = alpha
    v0[4] = slack / cfg.deadline_s[1]  # slack_s
    v0[5] = up / UPLINK_SCALE_S
    if (alpha > 1.0 - 1e-9).any():
        v0[6] = expected_tokens_per_iteration(alpha, cfg.max_gamma) / (cfg.max_gamma + 1)
    else:  # its formula with the same operands, without the np.where that would take it everywhere
        a, gamma = np.asarray(alpha, dtype=float), np.asarray(cfg.max_gamma, dtype=float)
        v0[6] = (1.0 - a ** (gamma + 1.0)) / (1.0 - a) / (cfg.max_gamma + 1)
    v0[7] = 1.0
    v0.clip(0.0, 1.0, out=v0)
    f = np.empty((k, USER_FEATURES), dtype=np.float32)  # filled column block by block (float32 casts as astype does)
    f[:, :8] = v0.T
    f[:, 8] = 0.0 if has is None else has
    f[:, 9] = 0.0 if rtt is None else (rtt / RTT_SCALE_S).clip(0.0, 1.0)
    return f
