"""The module boundaries: named accessors instead of private tuples, layering, no import circles."""

from __future__ import annotations

import numpy as np
import pytest

from envs.config import EnvConfig
from envs.cost_model import CostModel
from envs.plan_builder import PlanBuilder, ScalarPlan
from envs.workload import sample_round

CFG = EnvConfig(num_users=8)
COST = CostModel.from_config(CFG)


def _user_args(rnd, k, n=1):
    return tuple(np.full(n, v) for v in (rnd.input_tokens[k], rnd.output_tokens[k], rnd.alpha[k], rnd.uplink_s[k], rnd.slack_s[k]))


@pytest.mark.parametrize("seed", range(5))
def test_candidate_accessors_match_what_apply_commits(seed):
    rng = np.random.default_rng(seed)
    rnd = sample_round(rng, CFG)
    builder, scalar = PlanBuilder(COST, 1, CFG.max_gamma), ScalarPlan(COST, CFG.max_gamma)
    for k in range(rnd.num_users):
        assert not builder.is_prepared and not scalar.is_prepared
        masks = builder.prepare(*_user_args(rnd, k))
        scalar.prepare(int(rnd.input_tokens[k]), int(rnd.output_tokens[k]), float(rnd.alpha[k]), float(rnd.uplink_s[k]), float(rnd.slack_s[k]))
        assert builder.is_prepared and scalar.is_prepared
        share_a, share_s = builder.candidate_shares()
        mem_a, mem_s = builder.candidate_memory()
        assert share_s.shape == mem_s.shape == (1, CFG.max_gamma)
        assert scalar.candidate_ad_share() == share_a[0]
        allowed = np.flatnonzero(masks[0])
        action = int(rng.choice(allowed))
        builder.apply(np.array([action]))
        scalar.apply(action)
        if action == 1:
            assert builder.share[0][0] == share_a[0] and builder.mem[0][0] == mem_a[0]
        elif action >= 2:
            assert builder.share[1][0] == share_s[0, action - 2] and builder.mem[1][0] == mem_s[0, action - 2]
    with pytest.raises(RuntimeError, match="prepare"):
        builder.candidate_memory()
    with pytest.raises(RuntimeError, match="prepare"):
        scalar.candidate_ad_share()
