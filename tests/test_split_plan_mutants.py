"""Mode ED's round model at its edges (envs.split_plan, envs.split_outcome): on a profile whose passes all cost
powers of two (so every sum is exact) the per-user rows equal ``SplitCostModel.edge_iteration_s`` even where a
draft pass ends exactly when the verdict arrives, a user's edge KV fits exactly at ``I + O + g + 1`` tokens and
no deeper, and the exact check reads the depth's own column and accepts a compute share of exactly 1; the
input handling of ``ed_users`` (no ``has_edge``/``rtt_s``, 0/1 flags, float32 acceptance, bad ``max_gamma``,
acceptance exactly 1, a 1-token prompt); the batch formulas under ``kv_memory="padded"``, ``ed_share``'s 0/inf
cases and the empty batch's aggregates; the ``(z, ed_share, lam)`` split of every mix of modes (``shares_for``
without ED); the empty plan on a zero KV budget; ``evaluate_split_plan`` delegating ED-free plans to
``evaluate_plan`` with all its switches, its errors and its ``users`` reuse; and zero shares (never served, no
warning, no crash) in ``evaluate_split_plan``, ``served_from_aggregates`` and ``ed_own_latency``.
"""

from __future__ import annotations

import math
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
from split_rounds import PROFILE, G

from envs.config import EnvConfig
from envs.cost_model import CostModel
from envs.feasibility import EPS, shares_for
from envs.outcome import evaluate_plan
from envs.plan import AD, ED, REJECT, SD, Plan
from envs.profile import Profile, load_profile
from envs.split_cost import DraftTree, SplitCostModel
from envs.split_outcome import ed_own_latency, evaluate_split_plan, served_from_aggregates
from envs.split_plan import (
    check_plan_split,
    ed_aggregates,
    ed_memory,
    ed_memory1,
    ed_share,
    ed_time,
    ed_time1,
    ed_users,
    ed_users_arrays,
    shares_split,
)
from envs.split_profile import cpu_split_profile
from envs.workload import sample_round


@pytest.fixture(scope="module")
def models():
    p = load_profile(PROFILE)
    return CostModel(p), SplitCostModel(p)


def round_of(k: int, seed: int, edge_fraction: float = 0.6, profile: str = PROFILE, **kw):
    kw = {"rtt_ms": [5.0, 40.0], "deadline_s": [0.5, 8.0], **kw}
    cfg = EnvConfig(num_users=k, profile=profile, edge_fraction=edge_fraction, max_gamma=G, **kw)
    return sample_round(np.random.default_rng(seed), cfg)


def dyadic_profile(edge_kv_tokens: int | None = None) -> Profile:
    """Every server pass 0.5 s, every edge pass 0.25 s, a free network (RTT 0, 0 bytes): all sums exact.

    ``edge_kv_tokens``: the edge device holds exactly that many tokens of draft KV after its reserve and
    the draft's weights."""
    d = cpu_split_profile("cpu_specsched-pair")
    d.pop("engine", None)
    d.pop("calibration", None)
    flat = {"intercept_s": 0.5, "per_flop_s": 0.0, "per_byte_s": 0.0}
    d["latency"] = {"source": "linear", "llm": flat, "slm": flat}
    d["edge"]["latency"] = {"source": "table", "slm": {"b": [1], "q": [1], "c": [1], "tau_s": [[[0.25]]]}}
    d["network"] = {"rtt_ms": 0.0, "bandwidth_bytes_per_s": 1e6, "bytes_per_draft_token": 0, "bytes_per_reply_token": 0, "request_overhead_bytes": 0}
    if edge_kv_tokens is not None:
        p0 = Profile.from_dict(d, name="dyadic")
        d["edge"]["device"]["memory_bytes"] = d["edge"]["device"]["reserve_bytes"] + p0.slm.weight_bytes + edge_kv_tokens * p0.kv_slm_bytes
    return Profile.from_dict(d, name="dyadic")


def dyadic_round(k: int, inputs, outputs, alpha=0.5, deadline=100.0):
    rnd = round_of(k, 11, edge_fraction=1.0, profile="split_cpu_specsched-pair")
    rnd.input_tokens[:], rnd.output_tokens[:], rnd.alpha[:] = inputs, outputs, alpha
    rnd.realized_output_tokens[:], rnd.realized_alpha[:] = rnd.output_tokens, rnd.alpha
    rnd.rtt_s[:], rnd.uplink_s[:], rnd.deadline_s[:] = 0.0, 0.0, deadline
    return rnd


# ------------------------------------------------------------------------------------ per-user rows
def test_dyadic_rows_equal_edge_iteration_s_and_the_edge_kv_fits_exactly():
    """A draft pass ending exactly at the verdict (wait = 0.5 s = two edge passes) is finished, not in
    flight: the rows equal split_cost's per-user closed form; the edge KV ``(I + O + g + 1) kv_S`` fits
    up to and including the device's room, and the exact check reads depth g's own column."""
    p = dyadic_profile(edge_kv_tokens=20)
    cost, split = CostModel(p), SplitCostModel(p)
    rnd = dyadic_round(2, [8, 10], [8, 4])
    users = ed_users(split, rnd, G)
    for k in range(2):
        c_k = float(rnd.input_tokens[k]) + rnd.output_tokens[k] / 2.0
        for g in range(1, G + 1):
            x = split.edge_iteration_s(0.5, DraftTree.chain(g), c_k, 0.0, reused=False)
            assert users.edge_s[k, g - 1] == x, (k, g)
            e = (1 - 0.5 ** (g + 1)) / 0.5
            assert users.tokens[k, g - 1] == e
            assert users.iterations[k, g - 1] == math.ceil(rnd.output_tokens[k] / e)
    # literal: passes end at 0.25, 0.5, 0.75, 1.0; the wait is 0.5; depth 3 and 4 wait for pass 2 (0.25 s late)
    np.testing.assert_array_equal(users.edge_s, [[0.25, 0.5, 1.0, 1.25]] * 2)
    np.testing.assert_array_equal(users.prefill_s, [0.25, 0.25])
    # user 0: 8 + 8 + g + 1 <= 20 tokens iff g <= 3; user 1: 10 + 4 + g + 1 <= 20 at every depth
    np.testing.assert_array_equal(users.allowed, [[True, True, True, False], [True, True, True, True]])
    for g in range(1, G + 1):
        rep = check_plan_split(cost, users, rnd, [ED, REJECT], 1, [g, 0])
        assert rep.feasible == (g <= 3), g
        assert check_plan_split(cost, users, rnd, [REJECT, ED], 1, [0, g]).feasible


def one_ed_user_at_depth_2():
    """On the dyadic profile: the cost models, a one-user round (8-token prompt, 8 tokens out), its ED
    constants, the depth g = 2, that depth's iterations J, edge iteration X, the edge prefill and the
    ED batch's server time C_E."""
    p = dyadic_profile()
    cost, split = CostModel(p), SplitCostModel(p)
    rnd = dyadic_round(1, [8], [8])
    users = ed_users(split, rnd, G)
    g = 2
    j, x, pre = int(users.iterations[0, g - 1]), float(users.edge_s[0, g - 1]), float(users.prefill_s[0])
    return cost, split, rnd, users, g, j, x, pre, ed_time1(cost, 1, 8, 8, j, g + 1)


def test_a_compute_share_of_exactly_one_is_feasible():
    """One ED user whose deadline leaves exactly ``C_E`` for the server: ``C_E / beta_E`` is 1.0 and fits."""
    cost, split, rnd, users, g, j, x, pre, c_e = one_ed_user_at_depth_2()
    assert c_e == 0.5 + j * 0.5
    rnd.deadline_s[:] = pre + j * x + c_e
    rep = check_plan_split(cost, users, rnd, [ED], 1, [g])
    assert rep.ed_share_min == 1.0
    assert rep.feasible
    assert (rep.z, rep.ed_share, rep.lam) == (0.0, 1.0, 0.0)


def _tie(target: float, f, start: float) -> float:
    """The float ``x`` within 64 ulps of ``start`` with ``f(x) == target`` exactly (``f`` monotone)."""
    for direction in (math.inf, -math.inf):
        x = start
        for _ in range(64):
            if f(x) == target:
                return x
            x = math.nextafter(x, direction)
    raise AssertionError("no exact tie near start")


def test_the_tolerances_are_inclusive():
    """The check accepts a share sum of exactly ``1 + EPS`` (as ``check_plans`` does) and the outcome
    serves a latency of exactly ``deadline (1 + 1e-9)``; one ulp beyond, neither."""
    cost, split, rnd, users, g, j, x, pre, c_e = one_ed_user_at_depth_2()
    t = _tie(1.0 + EPS, lambda t: c_e / (t - 0.0 - pre - j * x), c_e / (1.0 + EPS) + pre + j * x)
    for deadline, ok in ((t, True), (math.nextafter(t, 0.0), False)):
        rnd.deadline_s[:] = deadline
        rep = check_plan_split(cost, users, rnd, [ED], 1, [g])
        assert rep.ed_share_min == c_e / (deadline - 0.0 - pre - j * x)
        assert rep.feasible == ok, deadline
    # the realised latency at share 1: U + C_E + P + J X (all exact here)
    latency = 0.0 + c_e + pre + j * x
    d = _tie(latency, lambda d: d * (1 + 1e-9), latency / (1 + 1e-9))
    plan = Plan(np.array([ED], dtype=np.int8), gamma=1, z=0.0, lam=0.0, ed_depth=np.array([g]), ed_share=1.0)
    for deadline, ok in ((d, True), (math.nextafter(d, 0.0), False)):
        rnd.deadline_s[:] = deadline
        out = evaluate_split_plan(cost, split, rnd, plan, users=users)
        assert out.latency_s[0] == latency
        assert out.served_count == ok
        agg = served_from_aggregates(cost, rnd, plan.modes, 1, 0.0, 1.0, [0, 0, 1], [0, 0, 8], [0, 0, 8], [0.0, 0.0, 0.0], [j, g + 1, pre, x])
        assert agg == ok


def test_ed_users_inputs(models):
    cost, split = models
    rnd = round_of(5, 21, edge_fraction=1.0)
    ref = ed_users(split, rnd, G)
    assert ref.allowed.dtype == bool and ref.allowed.any()
    # no edge information: nobody has an edge; no per-user RTT: the network section's
    r0 = round_of(5, 21, edge_fraction=1.0)
    r0.has_edge = None
    r0.rtt_s = None
    u0 = ed_users(split, r0, G)
    assert u0.allowed.shape == (5, G) and not u0.allowed.any()
    r1 = round_of(5, 21, edge_fraction=1.0)
    r1.rtt_s = np.full(5, split.net.rtt_s)
    np.testing.assert_array_equal(u0.edge_s, ed_users(split, r1, G).edge_s)
    # edge flags given as 0/1 numbers mean the same as booleans
    flags = np.array([1.0, 0.0, 1.0, 1.0, 0.0])
    r2 = round_of(5, 21, edge_fraction=1.0)
    r2.has_edge = flags
    u2 = ed_users(split, r2, G)
    np.testing.assert_array_equal(u2.allowed, ref.allowed & flags.astype(bool)[:, None])
    args = (rnd.input_tokens, rnd.output_tokens, rnd.alpha)
    u3 = ed_users_arrays(split, *args, flags, rnd.rtt_s, G)
    np.testing.assert_array_equal(u3.allowed, u2.allowed)
    # acceptance stored in float32: the rows of its (exact) float64 values
    a32 = np.array([0.123456789, 0.3, 0.41, 0.7, 0.9], dtype=np.float32)
    u4 = ed_users_arrays(split, rnd.input_tokens, rnd.output_tokens, a32, rnd.has_edge, rnd.rtt_s, G)
    u5 = ed_users_arrays(split, rnd.input_tokens, rnd.output_tokens, a32.astype(float), rnd.has_edge, rnd.rtt_s, G)
    for f in ("tokens", "iterations", "edge_s", "allowed", "prefill_s"):
        np.testing.assert_array_equal(getattr(u4, f), getattr(u5, f), err_msg=f)
    # max_gamma must be a true integer >= 1
    for bad in (True, 2.0, 0, -1):
        with pytest.raises(ValueError, match="max_gamma"):
            ed_users(split, rnd, bad)
    assert ed_users(split, rnd, np.int64(G)).tokens.shape == (5, G)


def test_acceptance_one_and_a_one_token_prompt(models):
    """Acceptance exactly 1 drafts ``g + 1`` tokens per iteration (the limit of E_k), without a
    division warning; a prompt of 1 (or 0) tokens prefills as tau_E(1, 1, 1)."""
    _, split = models
    rnd = round_of(3, 5, edge_fraction=1.0)
    rnd.alpha[:] = [1.0, 0.5, 1.0]
    rnd.output_tokens[:] = [60, 60, 7]
    rnd.input_tokens[:] = [1, 0, 300]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        users = ed_users(split, rnd, G)
    g1 = np.arange(2, G + 2)
    np.testing.assert_array_equal(users.tokens[0], g1)
    np.testing.assert_array_equal(users.iterations[0], np.ceil(60 / g1))
    np.testing.assert_array_equal(users.iterations[2], np.ceil(7 / g1))
    np.testing.assert_allclose(users.tokens[1], (1 - 0.5 ** g1) / 0.5, rtol=1e-15)
    one = split.tau_e.tau1(1, 1, 1)
    assert users.prefill_s[0] == pytest.approx(one, rel=1e-12) and users.prefill_s[1] == pytest.approx(one, rel=1e-12)
    assert users.prefill_s[2] == pytest.approx(split.tau_e.tau1(1, 300, 300), rel=1e-12)


# ------------------------------------------------------------------------------------ the ED batch
def test_padded_memory_and_batch_formulas(models):
    """``kv_memory="padded"``: the ED batch holds ``b (S + N + q) kv_L`` (scalar, array and the check)."""
    p = load_profile(PROFILE)
    cost = CostModel(p, "padded")
    for b, s, n, so, q in [(1, 100, 60, 60, 4), (3, 120, 100, 210, 5), (7, 1, 300, 900, 2)]:
        want = b * (s + n + q) * cost.kv_l
        assert ed_memory1(cost, b, s, n, so, q) == pytest.approx(want, rel=1e-15)
        assert float(ed_memory(cost, b, s, n, so, q)) == pytest.approx(want, rel=1e-15)
    _, split = models
    rnd = round_of(3, 1, edge_fraction=1.0)
    rnd.input_tokens[:], rnd.output_tokens[:] = [50, 120, 80], [100, 40, 70]
    users = ed_users(split, rnd, G)
    rep = check_plan_split(cost, users, rnd, [ED, ED, ED], 1, [4, 1, 2])
    assert rep.ed_memory_bytes == pytest.approx(3 * (120 + 100 + 5) * cost.kv_l, rel=1e-15)
    # the time: C_E = tau_L(b, S, S) + J tau_L(b, q, S + N/2 + q); S clamped to >= 1; 0 when empty
    tau = cost.tau_l.tau1
    assert ed_time1(cost, 2, 0, 10, 3, 2) == pytest.approx(tau(2, 1, 1) + 3 * tau(2, 2, 1 + 5 + 2), rel=1e-12)
    np.testing.assert_allclose(ed_time(cost, np.array([0, 2, 5]), np.array([9, 0, 40]), np.array([9, 10, 30]), np.array([9, 3, 7]), np.array([9, 2, 3])),
                               [0.0, ed_time1(cost, 2, 0, 10, 3, 2), ed_time1(cost, 5, 40, 30, 7, 3)], rtol=1e-12)


def test_ed_share_cases():
    """``C_E / beta_E``; inf when the budget is <= 0; 0 for an empty batch whatever its budget."""
    assert float(ed_share(0.3, 2, 0.6)) == pytest.approx(0.5)
    assert float(ed_share(0.3, 2, 0.0)) == math.inf
    assert float(ed_share(0.3, 2, -1.0)) == math.inf
    assert float(ed_share(0.0, 0, -1.0)) == 0.0
    assert float(ed_share(0.0, 0, 0.0)) == 0.0
    np.testing.assert_array_equal(ed_share(np.array([0.3, 0.375, 0.0, 0.25]), np.array([1, 1, 0, 3]), np.array([0.0, 1.5, -2.0, 0.5])),
                                  [math.inf, 0.25, 0.0, 0.5])


def test_aggregates_of_the_empty_and_a_small_batch(models):
    _, split = models
    rnd = round_of(4, 8, edge_fraction=1.0)
    users = ed_users(split, rnd, G)
    empty = ed_aggregates(users, rnd, np.array([], dtype=np.int64), np.array([], dtype=np.int64))
    assert empty == {"b": 0, "s_max": 0, "n_max": 0, "j_max": 0, "q_max": 0, "u_max": 0.0, "t_min": math.inf, "p_max": 0.0, "x_max": 0.0, "sum_out": 0}
    idx, depth = np.array([0, 2]), np.array([1, 3])
    agg = ed_aggregates(users, rnd, idx, depth)
    assert agg == {"b": 2, "s_max": int(rnd.input_tokens[idx].max()), "n_max": int(rnd.output_tokens[idx].max()),
                   "j_max": int(max(users.iterations[0, 0], users.iterations[2, 2])), "q_max": 4, "u_max": float(rnd.uplink_s[idx].max()),
                   "t_min": float(rnd.deadline_s[idx].min()), "p_max": float(users.prefill_s[idx].max()),
                   "x_max": float(max(users.edge_s[0, 0], users.edge_s[2, 2])), "sum_out": int(rnd.output_tokens[idx].sum())}


# ------------------------------------------------------------------------------------ shares
def test_shares_of_every_mix_of_modes(models):
    """Without ED the shares are ``shares_for``'s; with ED each non-empty mode gets ``r_m / sum r`` (SD
    the rest), and ``lam`` is AD's share of the KV in use."""
    cost, split = models
    rnd = round_of(6, 30, edge_fraction=1.0, deadline_s=[6.0, 8.0])
    rnd.deadline_s[:] = 60.0
    users = ed_users(split, rnd, G)
    depth = np.array([1, 2, 3, 4, 1, 2])
    seen = 0
    for modes in ([AD] * 6, [SD] * 6, [ED] * 6, [REJECT] * 6, [AD, AD, SD, SD, REJECT, AD], [AD, ED, ED, REJECT, AD, ED],
                  [SD, ED, SD, ED, REJECT, SD], [AD, SD, ED, AD, SD, ED], [AD, REJECT, REJECT, REJECT, REJECT, REJECT]):
        m = np.array(modes)
        rep = check_plan_split(cost, users, rnd, m, 2, depth)
        assert rep.feasible, modes
        r_a, r_s, r_e = rep.ad_share_min, rep.sd_share_min, rep.ed_share_min
        m_a, m_s, m_e = rep.ad_memory_bytes, rep.sd_memory_bytes, rep.ed_memory_bytes
        b_a, b_s, b_e = (int(np.count_nonzero(m == x)) for x in (AD, SD, ED))
        if b_e == 0:
            z, lam = shares_for(r_a, r_s, m_a, m_s, b_a, b_s)
            assert (rep.z, rep.ed_share, rep.lam) == (float(z), 0.0, float(lam)), modes
        elif b_a == b_s == 0:
            assert (rep.z, rep.ed_share, rep.lam) == (0.0, 1.0, 0.0), modes
        else:
            total = r_a + r_s + r_e
            assert rep.z == pytest.approx(r_a / total, rel=1e-12), modes
            assert rep.ed_share == pytest.approx(r_e / total if b_s else 1.0 - r_a / total, rel=1e-12), modes
            assert rep.lam == pytest.approx(m_a / (m_a + m_s + m_e), rel=1e-12), modes
            assert rep.z + rep.ed_share <= 1.0 + 1e-12 and rep.z >= r_a * (1 - 1e-12) and rep.ed_share >= r_e * (1 - 1e-12)
        seen += 1
    assert seen == 9
    # the split is unit-free: memories in any unit (here fractions of one byte) give the same lam
    assert shares_split(0.2, 0.2, 0.0, 0.25, 0.25, 0.0, 1, 1, 0) == (0.5, 0.0, 0.5)
    assert shares_split(0.2, 0.0, 0.2, 0.25, 0.0, 0.25, 1, 0, 1) == (0.5, 0.5, 0.5)
    assert shares_split(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0, 0, 0) == (1.0, 0.0, 1.0)


def test_the_empty_plan_fits_a_server_with_no_kv_room(models):
    """Memory exactly the reserve and the target's weights: the budget is 0, the empty plan fits, any user not."""
    _, split = models
    p = load_profile(PROFILE)
    cost = CostModel(p.with_memory(p.device.reserve_bytes + p.llm.weight_bytes))
    rnd = round_of(3, 2, edge_fraction=1.0)
    users = ed_users(split, rnd, G)
    rep = check_plan_split(cost, users, rnd, [REJECT] * 3, 1, [0, 0, 0])
    assert rep.memory_budget_bytes == 0.0
    assert rep.feasible
    assert not check_plan_split(cost, users, rnd, [ED, REJECT, REJECT], 1, [1, 0, 0]).feasible


def test_float_depths_are_read_as_depths(models):
    cost, split = models
    rnd = round_of(3, 1, edge_fraction=1.0)
    users = ed_users(split, rnd, G)
    a = check_plan_split(cost, users, rnd, [ED, ED, AD], 1, [4, 1, 0])
    b = check_plan_split(cost, users, rnd, [ED, ED, AD], 1, np.array([4.0, 1.0, 0.0]))
    assert a == b


# ------------------------------------------------------------------------------------ outcome
@pytest.mark.parametrize("kw", [{"simulate_acceptance": True}, {"completion": "own"}, {"sharing": "work_conserving"}, {"sharing": "steps"}])
def test_plans_without_ed_are_evaluate_plan(models, kw):
    cost, split = models
    differs = 0
    for seed in range(6):
        rnd = round_of(10, 60 + seed, output_cv=0.4, alpha_cv=0.2)
        rng = np.random.default_rng(seed)
        modes = rng.choice([REJECT, AD, SD], size=10, p=[0.2, 0.4, 0.4]).astype(np.int8)
        plan = Plan(modes, gamma=3, z=0.4, lam=0.5)
        got = evaluate_split_plan(cost, split, rnd, plan, rng=np.random.default_rng(seed), **kw)
        want = evaluate_plan(cost, rnd, plan, rng=np.random.default_rng(seed), **kw)
        assert got.latency_s.tobytes() == want.latency_s.tobytes() and (got.ad_batch_s, got.sd_batch_s) == (want.ad_batch_s, want.sd_batch_s)
        np.testing.assert_array_equal(got.served, want.served)
        plain = evaluate_plan(cost, rnd, plan, rng=np.random.default_rng(seed))
        differs += plain.latency_s.tobytes() != want.latency_s.tobytes()
    assert differs > 0  # the switch matters on these rounds


def test_outcome_errors(models):
    cost, split = models
    rnd = round_of(3, 4, edge_fraction=1.0)
    plan = Plan(np.array([ED, AD, REJECT], dtype=np.int8), gamma=1, z=0.3, ed_depth=np.array([2, 0, 0]), ed_share=0.5)
    users = ed_users(split, rnd, G)
    msg = r"^a plan with ED users needs a SplitCostModel and plan\.ed_depth$"
    with pytest.raises(ValueError, match=msg):
        evaluate_split_plan(cost, None, rnd, plan, users=users)
    with pytest.raises(ValueError, match=msg):
        evaluate_split_plan(cost, split, rnd, Plan(plan.modes, gamma=1, z=0.3, ed_share=0.5), users=users)
    with pytest.raises(ValueError, match="completion must be 'batch' or 'own'"):
        evaluate_split_plan(cost, split, rnd, plan, completion="token")


def test_users_are_a_cache_only(models):
    """Passing the predicted rows never changes the outcome, also when only the realised acceptance or
    only the realised outputs differ from the predictions."""
    cost, split = models
    for which in ("alpha", "output"):
        for seed in range(4):
            rnd = round_of(8, 200 + seed, edge_fraction=1.0)
            if which == "alpha":
                rnd.realized_alpha = np.clip(rnd.alpha * 0.7, 0.05, 0.95)
            else:
                rnd.realized_output_tokens = rnd.output_tokens * 2 + 3
            users = ed_users(split, rnd, G)
            modes = np.array([ED, ED, AD, SD, ED, REJECT, SD, ED], dtype=np.int8)
            plan = Plan(modes, gamma=2, z=0.2, lam=0.5, ed_depth=np.array([1, 4, 0, 0, 2, 0, 0, 3]), ed_share=0.5)
            a = evaluate_split_plan(cost, split, rnd, plan, users=users)
            b = evaluate_split_plan(cost, split, rnd, plan)
            assert a.latency_s.tobytes() == b.latency_s.tobytes(), (which, seed)
            assert not np.array_equal(a.latency_s[modes == ED], evaluate_split_plan(cost, split, _predicted(rnd), plan).latency_s[modes == ED])


def _predicted(rnd):
    """``rnd`` with realised outputs and acceptance equal to the predictions."""
    from dataclasses import replace

    return replace(rnd, realized_output_tokens=rnd.output_tokens.copy(), realized_alpha=rnd.alpha.copy())


def _aggregates(rnd, users, modes, depth):
    b, s, n, u = [], [], [], []
    for m in (AD, SD, ED):
        idx = np.flatnonzero(modes == m)
        b.append(int(idx.size))
        s.append(int(rnd.input_tokens[idx].max(initial=0)))
        n.append(int(rnd.output_tokens[idx].max(initial=0)))
        u.append(float(rnd.uplink_s[idx].max(initial=0.0)))
    idx = np.flatnonzero(modes == ED)
    col = depth[idx] - 1
    ed = [int(users.iterations[idx, col].max()), int(depth[idx].max()) + 1, float(users.prefill_s[idx].max()), float(users.edge_s[idx, col].max())]
    return b, s, n, u, ed


@pytest.mark.parametrize("ed_completion", ["batch", "own"])
@pytest.mark.parametrize("completion", ["batch", "own"])
def test_zero_shares_serve_nobody_in_that_batch(models, completion, ed_completion):
    """A batch without a compute share never ends (latency inf, not served) -- without a warning or an
    error -- and the aggregate count (served_from_aggregates) agrees with evaluate_split_plan."""
    cost, split = models
    rnd = _predicted(round_of(9, 300, edge_fraction=1.0, deadline_s=[20.0, 40.0]))
    users = ed_users(split, rnd, G)
    modes = np.array([AD, SD, ED, AD, SD, ED, AD, SD, ED], dtype=np.int8)
    depth = np.where(modes == ED, 2, 0)
    for z, e in [(0.0, 0.5), (0.5, 0.0), (0.5, 0.5), (0.4, 0.3), (1.0, 0.0), (0.0, 1.0)]:
        plan = Plan(modes, gamma=2, z=z, lam=0.5, ed_depth=depth, ed_share=e)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            out = evaluate_split_plan(cost, split, rnd, plan, completion=completion, users=users, ed_completion=ed_completion)
            agg = served_from_aggregates(cost, rnd, modes, 2, z, e, *_aggregates(rnd, users, modes, depth)) if ed_completion == "batch" else None
        for m, share in ((AD, z), (SD, 1.0 - z - e), (ED, e)):
            sel = modes == m
            assert np.isinf(out.latency_s[sel]).all() == (share <= 0), (z, e, m)
            assert not out.served[sel].any() or share > 0
        assert out.served_count > 0  # the deadlines are loose: some batch with a share serves its users
        if agg is not None:
            assert agg == out.served_count, (z, e)


def test_own_latency_clamps_an_empty_prompt_and_the_busiest_user_pays_the_batch():
    """ed_own_latency's server work is ed_time1's (S clamped to >= 1): toy pass time 0.1 b + 0.01 q."""

    class LinearTau:
        def tau1(self, b, q, c):
            return 0.1 * b + 0.01 * q

    cost = SimpleNamespace(tau_l=LinearTau())
    for s_max in (0, 1):
        got = ed_own_latency(cost, 1, s_max, 0, 2, np.array([3]), 0.0, np.array([0.0]), np.array([0.0]), 1.0)
        # tau(1, 1, 1) + 3 tau(1, 2, .) = 0.11 + 3 * 0.12
        assert got[0] == pytest.approx(0.47, abs=1e-12)
        assert got[0] == ed_time1(cost, 1, s_max, 0, 3, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = ed_own_latency(cost, 2, 5, 5, 3, np.array([1, 2]), 0.1, np.array([0.1, 0.2]), np.array([0.1, 0.1]), 0.0)
    assert np.isinf(got).all()
