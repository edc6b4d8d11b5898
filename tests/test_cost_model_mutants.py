"""Pins envs.cost_model at the edges its main tests leave open: the near-one threshold of the
expected tokens per SD iteration (strict, ``alpha > 1 - 1e-9``, in the array and the scalar form),
the formula's float64 arithmetic for a narrower acceptance dtype, the near-one branch raising no
floating-point warning at any depth, ``sd_parts_all1`` against hand values and ``sd_parts1`` (also
for prompts shorter than one token), and which cost models ``sd_parts_are_plain`` admits.

Hand values use the linear ``golden_round`` profile: ``tau_L(b, q, c) = 0.010 + 0.001 b q +
0.0001 b c`` and ``tau_S(b, q, c) = 0.002 + 0.0002 b q + 0.00002 b c``.
"""

from __future__ import annotations

import dataclasses
import math
import warnings

import numpy as np
import pytest
from golden_round import golden_cost, profile_dict, tau_l, tau_s

from envs.cost_model import CostModel, expected_tokens_per_iteration, sd_iterations, sd_iterations1
from envs.model_choices import ModelChoices
from envs.profile import Profile

R = 1e-12  # floating-point rounding only
COST = golden_cost()
ENGINE = {"b": [1, 2], "ad_step_s": [0.001, 0.002], "sd_iteration_s": [0.003, 0.004], "sd_draft_step_s": [0.0005, 0.001]}

THRESHOLD = 1.0 - 1e-9  # the near-one cut every module uses: alpha > THRESHOLD takes E = gamma + 1


def approx(x):
    return pytest.approx(x, rel=R, abs=1e-15)


# ------------------------------------------------------------------ expected tokens per iteration
def test_alpha_at_the_threshold_uses_the_closed_form():
    """The shortcut ``E = gamma + 1`` is strictly above ``1 - 1e-9``: at the threshold itself E is the
    closed form ``(1 - a^(g+1)) / (1 - a)``. At depth 1000 that is 1001 - 5e-4 (far beyond the formula's
    rounding, ~1e-7 there, which differs between Python's and numpy's power and between hosts), so 1001
    tokens need 2 iterations (the shortcut would give exactly 1), in both forms."""
    a, g = THRESHOLD, 1000
    closed = (1.0 - a ** (g + 1.0)) / (1.0 - a)
    assert closed < g + 1.0 - 1e-4  # the closed form is well below the shortcut at this depth
    assert float(expected_tokens_per_iteration(a, g)) == pytest.approx(closed, rel=1e-9)
    assert int(sd_iterations(g + 1, a, g)) == 2
    assert sd_iterations1(g + 1, a, g) == 2
    # one ulp above the threshold is "near one": exactly gamma + 1 tokens, one iteration for g + 1
    above = math.nextafter(a, 2.0)
    assert float(expected_tokens_per_iteration(above, g)) == g + 1.0
    assert int(sd_iterations(g + 1, above, g)) == 1 and sd_iterations1(g + 1, above, g) == 1


def test_expected_tokens_are_float64_for_a_float32_acceptance():
    """E is computed in float64 whatever the acceptance array's dtype: a float32 alpha gives the E of
    the same value as a float64 (at depth 1, ``E = 1 + a`` exactly)."""
    a32 = np.array([0.123, 0.7], dtype=np.float32)
    a64 = a32.astype(np.float64)
    e = expected_tokens_per_iteration(a32, 1)
    assert e.dtype == np.float64
    assert e[0] == approx(1.0 + float(a64[0]))
    np.testing.assert_array_equal(e, expected_tokens_per_iteration(a64, 1))
    for g in (2, 3, 8):
        np.testing.assert_array_equal(expected_tokens_per_iteration(a32, g), expected_tokens_per_iteration(a64, g))


@pytest.mark.parametrize("gamma", [1, 4, 2000])
def test_full_acceptance_is_gamma_plus_one_without_float_warnings(gamma):
    """At ``alpha = 1`` (and just below 1 within the cut) every draft is accepted: ``E = gamma + 1``
    at any depth, and the unused closed-form branch raises no divide/overflow warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with np.errstate(divide="warn", over="warn", invalid="warn", under="ignore"):
            e = expected_tokens_per_iteration(np.array([1.0, 1.0 - 1e-10, 0.5]), gamma)
    assert e[0] == gamma + 1.0 and e[1] == gamma + 1.0
    assert e[2] == approx((1.0 - 0.5 ** (gamma + 1)) / 0.5)


# ------------------------------------------------------------------ SD parts at every depth
@pytest.mark.parametrize("s_max", [0, 1])
def test_sd_parts_all1_for_a_one_token_prompt_by_hand(s_max):
    """``sd_parts_all1(b, S, N, G) = (prefill, iteration(1..G))``, the prompt clamped to >= 1 token.

    b = 1, S = max(S, 1) = 1, N = 2: mean context c = 1 + 2/2 = 2;
    prefill = tau_L(1,1,1) + tau_S(1,1,1) = 0.0111 + 0.00222 = 0.01332;
    draft step tau_S(1,1,2) = 0.00224; iteration(g) = g * 0.00224 + tau_L(1, g+1, 2+g):
    iteration(1) = 0.00224 + 0.0123 = 0.01454; iteration(2) = 0.00448 + 0.0134 = 0.01788;
    iteration(3) = 0.00672 + 0.0145 = 0.02122.
    """
    assert tau_l(1, 1, 1) + tau_s(1, 1, 1) == approx(0.01332)
    parts = COST.sd_parts_all1(1, s_max, 2, 3)
    assert len(parts) == 4
    assert parts == pytest.approx((0.01332, 0.01454, 0.01788, 0.02122), rel=R)
    for g in (1, 2, 3):  # the same floats as sd_parts1 at each depth
        assert COST.sd_parts1(1, s_max, 2, g) == (parts[0], parts[g])


def test_sd_parts_all1_is_sd_parts1_at_every_depth():
    """For larger batches and prompts each depth's parts are sd_parts1's, bit for bit, and
    ``prefill + J * iteration`` is ``sd_time1``."""
    for b, s, n, g_max in [(2, 10, 4, 4), (3, 17, 9, 2), (1, 2, 1, 1)]:
        parts = COST.sd_parts_all1(b, s, n, g_max)
        assert len(parts) == g_max + 1
        for g in range(1, g_max + 1):
            assert COST.sd_parts1(b, s, n, g) == (parts[0], parts[g])
            assert parts[0] + 3.0 * parts[g] == COST.sd_time1(b, s, n, 3, g)
    # b = 2, S = 10: prefill = tau_L(2,10,10) + tau_S(2,10,10) = 0.032 + 0.0064 = 0.0384
    assert COST.sd_parts_all1(2, 10, 4, 1)[0] == approx(0.0384)


# ------------------------------------------------------------------ sd_parts_are_plain
def _cost(engine=None, choices=None) -> CostModel:
    return CostModel(Profile.from_dict(profile_dict(engine=engine)), "per_user", choices)


def test_sd_parts_are_plain_only_without_optional_terms():
    """The base class with no verify compute and no engine overhead is plain; each optional term
    alone, or both, makes it not plain."""
    assert _cost().sd_parts_are_plain() is True
    assert _cost(engine=ENGINE).sd_parts_are_plain() is False
    assert _cost(choices=ModelChoices(verify_flops_efficiency=0.5)).sd_parts_are_plain() is False
    assert _cost(engine=ENGINE, choices=ModelChoices(verify_flops_efficiency=0.5)).sd_parts_are_plain() is False
    # the other alternative choices change memory only: still plain
    assert _cost(choices=ModelChoices(draft_kv="target", sd_user_workspace_bytes=10.0, sd_overhead_bytes=5.0)).sd_parts_are_plain() is True


@pytest.mark.parametrize("method", ["sd_parts1", "sd_parts_all1", "_sd_iterations1"])
def test_sd_parts_are_not_plain_when_a_subclass_overrides_one(method):
    """A subclass overriding any one of the three SD-part methods is not plain (a caller must call
    its methods); a subclass overriding none of them is."""

    def passthrough(self, *args):
        return getattr(CostModel, method)(self, *args)

    overriding = type("Overriding", (CostModel,), {method: passthrough})
    neutral = type("Neutral", (CostModel,), {"times_version": lambda self: 1})
    profile = Profile.from_dict(profile_dict())
    assert overriding(profile).sd_parts_are_plain() is False
    assert neutral(profile).sd_parts_are_plain() is True
    no_engine = dataclasses.replace(profile, engine=None)
    assert overriding(no_engine).sd_parts_are_plain() is False
