"""envs.step_sharing / evaluate_plan(sharing="steps"): the executor's whole-step time-slicing.

The executor cannot split a forward pass, so a batch's first step (AD: its whole prefill) makes the
other batch wait; the fluid models let both progress at their shares at once."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envs import step_sharing
from envs.cost_model import CostModel
from envs.outcome import evaluate_plan
from envs.plan import AD, REJECT, SD, Plan
from envs.profile import LatencyModel, load_profile
from envs.step_sharing import job_order, run_whole_steps
from envs.workload import Round

PROFILE = "cpu1_specsched-pair"


class Flat(LatencyModel):
    """A hand-checkable pass time: ``prefill_s`` for a pass over >= 10 new tokens, else ``per_token_s`` per new token."""

    def __init__(self, prefill_s: float, per_token_s: float):
        self.prefill_s, self.per_token_s = prefill_s, per_token_s

    def tau(self, b, q, c):
        q = np.asarray(q, dtype=float)
        t = np.where(q >= 10, self.prefill_s, self.per_token_s * q)
        return t * np.ones(np.broadcast(np.asarray(b), q, np.asarray(c)).shape)


def hand_cost() -> CostModel:
    """Target: prefill 0.3 s, 0.1 s per new token (decode 0.1 s, a gamma=1 verify of 2 tokens 0.2 s); draft: 0.05 s any pass; no engine overhead."""
    cost = CostModel(load_profile(PROFILE))
    cost.tau_l, cost.tau_s, cost.engine = Flat(0.3, 0.1), Flat(0.05, 0.05), None
    return cost


def hand_round() -> tuple[Round, Plan]:
    """Users 0, 1 in AD (outputs 1 and 3 tokens), users 2, 3 in SD (outputs 1 and 2, acceptance 0: one token per iteration), z = 0.5."""
    rnd = Round.from_requests(np.full(4, 20), np.array([1, 3, 1, 2]), np.full(4, 100.0), np.zeros(4), uplink_s=0.0, downlink_s=0.0)
    return rnd, Plan(modes=np.array([AD, AD, SD, SD]), gamma=1, z=0.5, lam=0.5)


# By hand. AD steps: prefill 0.3 (user 0's only token), then two decodes of 0.1 -> [0.3, 0.1, 0.1].
# SD steps (gamma 1, J = 1 and 2): first = target prefill 0.3 + draft prefill 0.05 + one iteration
# (draft 0.05 + verify 0.2 = 0.25) = 0.6, then one more iteration -> [0.6, 0.25].
# Executor, shares 0.5 / 0.5, AD first in the job order (ties go to it):
#   t=0    used/share AD 0 = SD 0  -> AD prefill 0.3         ends 0.3   (AD used 0.3 -> ratio 0.6)
#   t=0.3  SD 0 < AD 0.6           -> SD first step 0.6      ends 0.9   (SD 0.6 -> 1.2)
#   t=0.9  AD 0.6 < SD 1.2         -> AD decode 0.1          ends 1.0   (AD 0.8)
#   t=1.0  AD 0.8 < SD 1.2         -> AD decode 0.1          ends 1.1   AD done
#   t=1.1  only SD                 -> SD iteration 0.25      ends 1.35  SD done
# own completion: user 0 at 0.3, user 1 at 1.1, user 2 (J=1) at 0.9, user 3 (J=2) at 1.35.
# Fluid work-conserving for contrast: AD 0.5 s of work, SD 0.85 s, both at 0.5: AD ends at 1.0, SD has
# done 0.5 by then and does its last 0.35 alone: 1.35 (same round end: both are work-conserving).
HAND_OWN_S = [0.3, 1.1, 0.9, 1.35]
HAND_BATCH_S = [1.1, 1.1, 1.35, 1.35]


def check_hand_case(out) -> None:
    assert out.latency_s == pytest.approx(HAND_OWN_S, rel=1e-12)
    assert (out.ad_batch_s, out.sd_batch_s) == pytest.approx((1.1, 1.35), rel=1e-12)


def test_hand_two_batch_case():
    rnd, plan = hand_round()
    cost = hand_cost()
    check_hand_case(evaluate_plan(cost, rnd, plan, completion="own", sharing="steps"))
    batch = evaluate_plan(cost, rnd, plan, completion="batch", sharing="steps")
    assert batch.latency_s == pytest.approx(HAND_BATCH_S, rel=1e-12)
    fluid = evaluate_plan(cost, rnd, plan, completion="batch", sharing="work_conserving")
    assert (fluid.ad_batch_s, fluid.sd_batch_s) == pytest.approx((1.0, 1.35), rel=1e-12)  # the comment's fluid contrast


def test_hand_case_catches_a_prefill_split_by_the_share(monkeypatch):
    """Planted bug: a sharing rule that splits each step into slices (so the AD prefill progresses at
    its share beside SD, as in the fluid model) must fail the hand case."""
    rnd, plan = hand_round()

    def split_steps(jobs, pieces=1000):
        fine = run_whole_steps({k: ([d / pieces for d in steps for _ in range(pieces)], share) for k, (steps, share) in jobs.items()})
        return {k: v[pieces - 1 :: pieces] for k, v in fine.items()}  # the end of each whole step's last slice

    monkeypatch.setattr(step_sharing, "run_whole_steps", split_steps)
    buggy = evaluate_plan(hand_cost(), rnd, plan, completion="own", sharing="steps")
    assert buggy.latency_s[0] == pytest.approx(0.6, rel=1e-2)  # the prefill at share 0.5: 0.3 / 0.5
    with pytest.raises(AssertionError):
        check_hand_case(buggy)


def _round(inputs, outputs, alpha=0.8):
    k = len(inputs)
    return Round.from_requests(np.array(inputs), np.array(outputs), np.full(k, 100.0), np.full(k, alpha), uplink_s=0.05, downlink_s=0.01)


@pytest.mark.parametrize("completion", ["own", "batch"])
@pytest.mark.parametrize("mode", [AD, SD])
def test_one_batch_is_work_conserving(mode, completion):
    """One batch has the whole device: steps equal work_conserving (to float rounding: the AD decode
    sum of the cost model is a prefix-sum table, the steps are added one by one)."""
    cost = CostModel(load_profile(PROFILE))
    rnd = _round([100, 150, 80], [10, 40, 25])
    plan = Plan(modes=np.array([mode, mode, mode]), gamma=4, z=1.0 if mode == AD else 0.0, lam=0.5)
    steps = evaluate_plan(cost, rnd, plan, completion=completion, sharing="steps")
    fluid = evaluate_plan(cost, rnd, plan, completion=completion, sharing="work_conserving")
    assert steps.latency_s == pytest.approx(fluid.latency_s, rel=1e-12, abs=0) and (steps.served == fluid.served).all()
    assert (steps.ad_batch_s, steps.sd_batch_s) == pytest.approx((fluid.ad_batch_s, fluid.sd_batch_s), rel=1e-12, abs=0)


def test_simulated_acceptance_draws_the_same_iterations():
    cost = CostModel(load_profile(PROFILE))
    rnd = _round([100, 150, 80], [10, 40, 25])
    plan = Plan(modes=np.array([SD, SD, SD]), gamma=4, z=0.0, lam=0.5)
    steps = evaluate_plan(cost, rnd, plan, np.random.default_rng(3), simulate_acceptance=True, completion="own", sharing="steps")
    fluid = evaluate_plan(cost, rnd, plan, np.random.default_rng(3), simulate_acceptance=True, completion="own", sharing="work_conserving")
    assert steps.latency_s == pytest.approx(fluid.latency_s, rel=1e-12, abs=0)


def test_rejected_users_and_job_order():
    cost = CostModel(load_profile(PROFILE))
    rnd = _round([100, 150, 80, 60], [10, 40, 25, 5])
    plan = Plan(modes=np.array([SD, REJECT, AD, SD]), gamma=3, z=0.4, lam=0.5)
    assert job_order(plan.modes) == [SD, AD]
    out = evaluate_plan(cost, rnd, plan, completion="own", sharing="steps")
    assert np.isinf(out.latency_s[1]) and not out.served[1] and np.isfinite(out.latency_s[[0, 2, 3]]).all()


def test_bad_values_name_the_field():
    cost = CostModel(load_profile(PROFILE))
    rnd, plan = _round([10], [3]), Plan(modes=np.array([AD]), z=1.0)
    with pytest.raises(ValueError, match=r"sharing must be 'fixed', 'work_conserving' or 'steps', got 'step'"):
        evaluate_plan(cost, rnd, plan, sharing="step")
    with pytest.raises(ValueError, match="completion must be"):
        evaluate_plan(cost, rnd, plan, completion="first", sharing="steps")
    with pytest.raises(ValueError, match="share of job 'ad' must be >= 0"):
        run_whole_steps({"ad": ([0.1], -0.5)})
    with pytest.raises(ValueError, match="step_s of job 'sd' must all be >= 0"):
        run_whole_steps({"sd": ([0.1, float("nan")], 0.5)})


steps_s = st.lists(st.floats(1e-3, 1.0), min_size=1, max_size=15)


@settings(max_examples=200, deadline=None)
@given(a=steps_s, b=steps_s, share=st.floats(0.0, 1.0))
def test_whole_steps_properties(a, b, share):
    """Each job ends no earlier than alone (its own steps' sum), the steps of a job end in order and
    never overlap, and the device is never idle: the last step ends at the sum of all steps."""
    ends = run_whole_steps({"ad": (a, share), "sd": (b, 1.0 - share)})
    for name, steps in (("ad", a), ("sd", b)):
        assert len(ends[name]) == len(steps)
        assert ends[name][-1] >= sum(steps) * (1 - 1e-12)
        assert (np.diff(ends[name]) >= np.asarray(steps[1:]) * (1 - 1e-9)).all()  # a step runs whole, after the previous one
    assert max(ends["ad"][-1], ends["sd"][-1]) == pytest.approx(sum(a) + sum(b), rel=1e-12)
    # every instant the device is busy with exactly one step: the step intervals tile [0, total]
    starts_ends = sorted([(e - d, e) for name, steps in (("ad", a), ("sd", b)) for e, d in zip(ends[name], steps, strict=True)])
    assert starts_ends[0][0] == pytest.approx(0.0, abs=1e-12)
    for (_, end), (start, _) in zip(starts_ends, starts_ends[1:], strict=False):
        assert start == pytest.approx(end, abs=1e-9)


@settings(max_examples=40, deadline=None)
@given(inputs=st.lists(st.integers(1, 300), min_size=2, max_size=6), outputs=st.lists(st.integers(1, 60), min_size=6, max_size=6),
       split=st.integers(1, 5), z=st.floats(0.05, 0.95))
def test_outcome_properties_on_the_profile(inputs, outputs, split, z):
    """On the shipped profile, two batches: each batch ends no earlier than alone, and the round ends
    when the fluid work-conserving model ends it (both keep the device busy)."""
    k = len(inputs)
    split = min(split, k - 1)
    cost = CostModel(load_profile(PROFILE))
    rnd = _round(inputs, outputs[:k])
    modes = np.array([AD] * split + [SD] * (k - split))
    plan = Plan(modes=modes, gamma=3, z=z, lam=0.5)
    steps = evaluate_plan(cost, rnd, plan, completion="batch", sharing="steps")
    alone_ad = evaluate_plan(cost, rnd, Plan(modes=np.where(modes == AD, AD, REJECT), gamma=3, z=1.0), completion="batch", sharing="steps")
    alone_sd = evaluate_plan(cost, rnd, Plan(modes=np.where(modes == SD, SD, REJECT), gamma=3, z=0.0), completion="batch", sharing="steps")
    assert steps.ad_batch_s >= alone_ad.ad_batch_s * (1 - 1e-12) and steps.sd_batch_s >= alone_sd.sd_batch_s * (1 - 1e-12)
    fluid = evaluate_plan(cost, rnd, plan, completion="batch", sharing="work_conserving")
    assert max(steps.ad_batch_s, steps.sd_batch_s) == pytest.approx(max(fluid.ad_batch_s, fluid.sd_batch_s), rel=1e-9)
