"""The incremental builders memoise batch times: they must give what a fresh builder gives.

``envs.plan_builder.ScalarPlan`` (v0) and ``envs.split_builder.SplitScalarPlan`` (v1) keep their
memos across rounds for speed. A live server's cost model (``runtime.calibration.CalibratedCostModel``)
changes its times between rounds as the calibration moves; a long-lived scheduler (a learned policy's
env) must then plan with the new times, not the memoised old ones.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envs.config import EnvConfig
from envs.cost_model import CostModel
from envs.plan_builder import ScalarPlan
from envs.workload import sample_round
from runtime.calibration import CalibratedCostModel, StepCalibration


def _play(plan, users, actions):
    """Masks and state after each user (the same actions for every builder compared)."""
    trace = []
    plan.reset()
    for user, a in zip(users, actions, strict=True):
        masks = plan.prepare(*user)
        ok = [i for i, m in enumerate(masks) if m]
        plan.apply(ok[a % len(ok)])
        trace.append((tuple(masks), tuple(plan.share), tuple(plan.mem), plan.gamma))
    return trace


def _users(rnd):
    return list(zip(rnd.input_tokens.tolist(), rnd.output_tokens.tolist(), rnd.alpha.tolist(), rnd.uplink_s.tolist(), rnd.slack_s.tolist(), strict=True))


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10**6), factors=st.lists(st.tuples(st.floats(0.5, 3.0), st.floats(0.5, 3.0)), min_size=2, max_size=4),
       kv=st.sampled_from(["per_user", "padded"]))
def test_v0_builder_follows_a_calibration_that_moves_between_rounds(seed, factors, kv):
    """One ScalarPlan reused over rounds whose calibration factors change gives, every round, what a
    fresh ScalarPlan gives (a memo keyed on arguments alone would keep the first round's AD times)."""
    cfg = EnvConfig(num_users=24, kv_memory=kv)
    base = CostModel.from_config(cfg)
    calib = StepCalibration()
    cost = CalibratedCostModel(base, calib)
    reused = ScalarPlan(cost, cfg.max_gamma)
    rng = np.random.default_rng(seed)
    rnd = sample_round(rng, cfg)  # the same round every time: only the factors differ, so stale times would show
    actions = rng.integers(0, 1000, size=cfg.num_users).tolist()
    for ad, sd in factors:
        calib.factor["ad"], calib.factor["sd"] = ad, sd
        assert _play(reused, _users(rnd), actions) == _play(ScalarPlan(cost, cfg.max_gamma), _users(rnd), actions)


@pytest.mark.parametrize("kv", ["per_user", "padded"])
def test_v0_builder_memos_keep_every_float(kv):
    """Memoised or not, the same floats: a plan reused over many rounds (memos warm) against a fresh
    plan per round (memos cold), on random rounds."""
    cfg = EnvConfig(num_users=40, kv_memory=kv)
    cost = CostModel.from_config(cfg)
    reused = ScalarPlan(cost, cfg.max_gamma)
    rng = np.random.default_rng(7)
    for _ in range(20):
        rnd = sample_round(rng, cfg)
        actions = rng.integers(0, 1000, size=cfg.num_users).tolist()
        assert _play(reused, _users(rnd), actions) == _play(ScalarPlan(cost, cfg.max_gamma), _users(rnd), actions)


def test_v0_builder_forgets_times_memoised_while_a_calibration_moved_and_came_back():
    """An update can land while a round is planned (the engine threads calibrate as batches end) and
    the factor return to the same float before the next reset (one held at a bound): the times
    memoised in between were keyed as current by the factors alone."""
    cfg = EnvConfig(num_users=24)
    calib = StepCalibration(weight=1.0, bounds=(0.5, 2.0), margin_sd=0.0)
    cost = CalibratedCostModel(CostModel.from_config(cfg), calib)
    calib.update("ad", 10.0, 1.0)  # held at the upper bound: 2.0
    reused = ScalarPlan(cost, cfg.max_gamma)
    rng = np.random.default_rng(3)
    rnd = sample_round(rng, cfg)
    actions = rng.integers(0, 1000, size=cfg.num_users).tolist()
    reused.reset()
    calib.update("ad", 1.0, 1.0)  # mid-round: 1.0 ...
    _play_no_reset(reused, _users(rnd))  # ... the round's AD times memoised at 1.0
    calib.update("ad", 10.0, 1.0)  # back at the bound before the next reset: 2.0 again
    assert calib.factor["ad"] == 2.0
    assert _play(reused, _users(rnd), actions) == _play(ScalarPlan(cost, cfg.max_gamma), _users(rnd), actions)


def _play_no_reset(plan, users):
    for user in users:
        plan.prepare(*user)
        plan.apply(0)


def test_calibrated_cost_model_keeps_the_base_models_choices():
    """CalibratedCostModel rebuilt its CostModel from the profile and kv_memory alone: every modelling
    choice of the base (draft_kv, verify_flops_efficiency, the SD workspace and overhead) was dropped,
    so a factor of 1 priced other times and memory than the model it wraps."""
    cfg = EnvConfig(num_users=8, draft_kv="target", verify_flops_efficiency=0.5, sd_user_workspace_bytes=1e8, sd_overhead_bytes=2e8, kv_memory="padded")
    base = CostModel.from_config(cfg)
    cost = CalibratedCostModel(base, StepCalibration())  # factors 1.0
    assert cost.choices == base.choices and cost.kv_memory == base.kv_memory
    assert cost.sd_time1(8, 100, 120, 20, 4) == base.sd_time1(8, 100, 120, 20, 4)
    assert cost.ad_time1(8, 100, 120) == base.ad_time1(8, 100, 120)
    assert cost.sd_memory1(8, 100, 120, 500, 4) == base.sd_memory1(8, 100, 120, 500, 4)
    assert cost.memory_budget1(True) == base.memory_budget1(True)


def test_v1_builder_follows_a_calibration_that_moves_between_rounds():
    """The v1 builder (``envs.split_builder.SplitScalarPlan``, a learned v1 policy's env on the live
    split server) reused while the calibration's factors change gives what a fresh one gives."""
    from envs.split_builder import SplitScalarPlan

    cfg = EnvConfig(num_users=24)
    calib = StepCalibration()
    cost = CalibratedCostModel(CostModel.from_config(cfg), calib)
    reused = SplitScalarPlan(cost, cfg.max_gamma)
    rng = np.random.default_rng(0)
    for _ in range(5):
        rnd = sample_round(rng, cfg)
        actions = rng.integers(0, 1000, size=cfg.num_users).tolist()
        for ad, sd in ((1.0, 1.0), (2.5, 2.5), (0.6, 0.6)):
            calib.factor["ad"], calib.factor["sd"] = ad, sd
            assert _play(reused, _users(rnd), actions) == _play(SplitScalarPlan(cost, cfg.max_gamma), _users(rnd), actions)
