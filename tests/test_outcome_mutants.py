"""Pins envs.outcome.evaluate_plan's whole-step sharing (``sharing="steps"``) against hand values:
the executor's rule (the batch with the least ``used / share`` runs its next step whole, ties to the
mode first in the plan) on a round with an AD and an SD batch, both completions, one-batch plans,
and that "steps" is an accepted sharing value while other spellings are refused.

Hand values use the linear ``golden_round`` profile: ``tau_L(b, q, c) = 0.010 + 0.001 b q +
0.0001 b c`` and ``tau_S(b, q, c) = 0.002 + 0.0002 b q + 0.00002 b c``; uplinks and downlinks are 0,
so a user's latency is its compute finish time.
"""

from __future__ import annotations

import numpy as np
import pytest
from golden_round import golden_cost, make_round

from envs import AD, SD, Plan, evaluate_plan

R = 1e-12  # floating-point rounding only
COST = golden_cost()


def approx(x):
    return pytest.approx(x, rel=R, abs=1e-15)


def _round(inp, out, deadline, alpha=0.5):
    k = len(inp)
    return make_round(inp, out, deadline, [alpha] * k, [0.0] * k, [0.0] * k)


# AD user: I = 10, O = 3. Steps: prefill tau_L(1,10,10) = 0.021, then tau_L(1,1,11) = 0.0121 and
#   tau_L(1,1,12) = 0.0122 (batch total 0.0453).
# SD user: I = 10, O = 4, alpha = 0.5, gamma = 1: E = 1.5, J = ceil(4 / 1.5) = 3; c = 10 + 4/2 = 12;
#   iteration = tau_S(1,1,12) + tau_L(1,2,13) = 0.00244 + 0.0133 = 0.01574; first step = both
#   prefills + one iteration = 0.021 + 0.0042 + 0.01574 = 0.04094, then 2 x 0.01574 (total 0.07242).
# z = 0.5, plan order AD, SD. Whole steps: AD 0.021 (t 0.021; AD used/share 0.042) -> SD 0.04094
#   (t 0.06194; SD 0.08188) -> AD 0.0121 (t 0.07404; AD 0.0662 < 0.08188) -> AD 0.0122 (t 0.08624,
#   AD done) -> SD 0.01574 (t 0.10198) -> SD 0.01574 (t 0.11772 = 0.0453 + 0.07242).
# The fluid model at fixed shares instead ends AD at 0.0453 / 0.5 = 0.0906, SD at 0.07242 / 0.5 = 0.14484.
AD_END, SD_END = 0.08624, 0.11772


def _mixed(deadlines=(1.0, 1.0)):
    return _round([10, 10], [3, 4], list(deadlines)), Plan(np.array([AD, SD], dtype=np.int8), gamma=1, z=0.5, lam=1.0)


@pytest.mark.parametrize("completion", ["batch", "own"])
def test_whole_steps_on_an_ad_and_an_sd_batch_by_hand(completion):
    """Each batch's end, and each user's latency, under the executor's whole-step rule."""
    rnd, plan = _mixed()
    out = evaluate_plan(COST, rnd, plan, sharing="steps", completion=completion)
    assert out.ad_batch_s == approx(AD_END) and out.sd_batch_s == approx(SD_END)
    assert out.latency_s == pytest.approx([AD_END, SD_END], rel=R)
    # the fluid model at the same shares ends both later
    fluid = evaluate_plan(COST, rnd, plan, sharing="fixed", completion=completion)
    assert fluid.ad_batch_s == approx(0.0906) and fluid.sd_batch_s == approx(0.14484)


def test_whole_steps_decide_who_is_served():
    """Deadlines between the whole-step and the fluid finish times: served only under "steps"."""
    rnd, plan = _mixed(deadlines=(0.088, 0.12))
    assert evaluate_plan(COST, rnd, plan, sharing="steps").served.tolist() == [True, True]
    assert evaluate_plan(COST, rnd, plan, sharing="fixed").served.tolist() == [False, False]
    tight = _mixed(deadlines=(0.086, 0.117))[0]  # just before each whole-step finish
    assert evaluate_plan(COST, tight, plan, sharing="steps").served.tolist() == [False, False]


def test_whole_steps_own_completion_ends_each_user_at_its_last_step():
    """Two AD users (O = 2, 3) and one SD user, completion "own".

    AD b = 2, S = 10, N = 3: steps tau_L(2,10,10) = 0.032, tau_L(2,1,11) = 0.0142, tau_L(2,1,12) = 0.0144.
    SD as above: 0.04094, 0.01574, 0.01574. z = 0.5: AD 0.032 (t 0.032; 0.064) -> SD 0.04094
    (t 0.07294; 0.08188) -> AD 0.0142 (t 0.08714; 0.0924) -> SD 0.01574 (t 0.10288; 0.11336) ->
    AD 0.0144 (t 0.11728, AD done) -> SD 0.01574 (t 0.13302).
    User 0 ends with its 2nd token (0.08714), user 1 with its 3rd (0.11728), user 2 with its
    3rd iteration (0.13302); under "batch" both AD users end at 0.11728.
    """
    rnd = _round([10, 10, 10], [2, 3, 4], [1.0, 1.0, 1.0])
    plan = Plan(np.array([AD, AD, SD], dtype=np.int8), gamma=1, z=0.5, lam=1.0)
    own = evaluate_plan(COST, rnd, plan, sharing="steps", completion="own")
    assert own.latency_s == pytest.approx([0.08714, 0.11728, 0.13302], rel=R)
    assert own.ad_batch_s == approx(0.11728) and own.sd_batch_s == approx(0.13302)
    batch = evaluate_plan(COST, rnd, plan, sharing="steps", completion="batch")
    assert batch.latency_s == pytest.approx([0.11728, 0.11728, 0.13302], rel=R)


def test_whole_steps_tie_goes_to_the_mode_first_in_the_plan():
    """With SD listed first the SD batch takes the first step: SD 0.04094 (t 0.04094; 0.08188) ->
    AD 0.021 (t 0.06194; 0.042) -> AD 0.0121 (t 0.07404; 0.0662) -> AD 0.0122 (t 0.08624; 0.0906 >
    0.08188) -> SD 0.01574 (t 0.10198) -> SD 0.01574 (t 0.11772): both ends as with AD first. An SD
    user done after its first step (O = 1) then ends with that step, before any AD step."""
    rnd = _round([10, 10], [4, 3], [1.0, 1.0])
    plan = Plan(np.array([SD, AD], dtype=np.int8), gamma=1, z=0.5, lam=1.0)
    out = evaluate_plan(COST, rnd, plan, sharing="steps")
    assert out.ad_batch_s == approx(AD_END) and out.sd_batch_s == approx(SD_END)
    # SD users finishing after one iteration: O = 1 needs J = 1
    one = _round([10, 10], [1, 3], [1.0, 1.0])
    # SD steps: 0.021 + 0.0042 + (tau_S(1,1,10.5) + tau_L(1,2,11.5)) = 0.0252 + 0.00241 + 0.01315 = 0.04076
    first = evaluate_plan(COST, one, plan, sharing="steps", completion="own")
    assert first.latency_s[0] == approx(0.04076)
    assert first.sd_batch_s == approx(0.04076)


def test_whole_steps_with_one_batch_is_its_batch_time():
    """One batch has the whole device: its end is its cost-model batch time, whatever its share."""
    rnd = _round([10, 10], [3, 4], [1.0, 1.0])
    only_ad = evaluate_plan(COST, rnd, Plan(np.array([AD, AD], dtype=np.int8), gamma=1, z=0.3, lam=1.0), sharing="steps")
    # AD b = 2, S = 10, N = 4: 0.032 + 0.0142 + 0.0144 + 0.0146 = 0.0752
    assert only_ad.ad_batch_s == approx(0.0752) and only_ad.sd_batch_s == 0.0
    assert only_ad.latency_s == pytest.approx([0.0752, 0.0752], rel=R)
    only_sd = evaluate_plan(COST, rnd, Plan(np.array([SD, SD], dtype=np.int8), gamma=1, z=0.3, lam=1.0), sharing="steps", completion="own")
    # SD b = 2, S = 10, N = 4, c = 12: prefills 0.032 + 0.0064 = 0.0384; iteration
    # tau_S(2,1,12) + tau_L(2,2,13) = 0.00288 + 0.0166 = 0.01948; J = 2 (O = 3) and 3 (O = 4):
    # ends 0.0384 + 2 x 0.01948 = 0.07736 and 0.0384 + 3 x 0.01948 = 0.09684
    assert only_sd.latency_s == pytest.approx([0.07736, 0.09684], rel=R)
    assert only_sd.sd_batch_s == approx(0.09684) and only_sd.ad_batch_s == 0.0


@pytest.mark.parametrize("bad", ["STEPS", "Steps", "step", "XXstepsXX", ""])
def test_sharing_accepts_steps_and_refuses_other_spellings(bad):
    rnd, plan = _mixed()
    evaluate_plan(COST, rnd, plan, sharing="steps")  # accepted
    with pytest.raises(ValueError, match="sharing must be"):
        evaluate_plan(COST, rnd, plan, sharing=bad)
