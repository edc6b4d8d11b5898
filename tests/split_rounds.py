"""Shared by the ED round-model tests (``test_split_plan.py``, ``test_split_builder_mutants.py``):
sampled rounds on the A100 split profile, a user's ``SplitScalarPlan.prepare`` arguments and the
v1 action decoding at depth ``G``."""

from __future__ import annotations

import numpy as np

from envs.config import EnvConfig
from envs.plan import AD, ED, REJECT, SD
from envs.workload import sample_round

PROFILE = "split_a100-40gb_llama2-7b_tinyllama-1.1b"
G = 4


def round_of(k: int, seed: int, edge_fraction: float = 0.6):
    cfg = EnvConfig(num_users=k, profile=PROFILE, edge_fraction=edge_fraction, rtt_ms=[5.0, 40.0], max_gamma=G, deadline_s=[0.5, 8.0])
    return sample_round(np.random.default_rng(seed), cfg)


def user_args(rnd, users, k: int):
    ed = None
    if users.allowed[k].any():
        ed = (users.iterations[k].tolist(), users.edge_s[k].tolist(), users.allowed[k].tolist(), float(users.prefill_s[k]))
    return (int(rnd.input_tokens[k]), int(rnd.output_tokens[k]), float(rnd.alpha[k]), float(rnd.uplink_s[k]), float(rnd.slack_s[k]), float(rnd.deadline_s[k]), ed)


def decode(action: int):
    """(mode, sd depth, ed depth) of a v1 action index."""
    if action == 0:
        return REJECT, 0, 0
    if action == 1:
        return AD, 0, 0
    if action <= 1 + G:
        return SD, action - 1, 0
    return ED, 0, action - 1 - G
