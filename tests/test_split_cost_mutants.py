"""Pins the SpecEdge split-mode closed form (envs.split_cost, envs.split_cohorts, envs.draft_tree) at the edges its main tests leave open: option and tree validation (bools, strings, the smallest legal values, the messages), the near-1 acceptance branch of the chain formula, every per-user component rebuilt by hand from the module docstrings (prefill, the server-only verify and draft with SpecEdge's dense attention and KV staging, proactive drafting in both gains and both interrupts, the edge iteration for expected/hit/miss), the memory and steady-state records of both modes against their formulas, the cohort period ``max(V_A + V_B, V_A + X_A, V_B + X_B)``, the fixed point of the proactive waits, and the calibrated depth against a brute force over ``1..max_depth``."""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

import numpy as np
import pytest

from envs.draft_tree import DraftTree, expected_tokens, tree_shape
from envs.profile import load_profile
from envs.split_cohorts import (
    Proactive,
    check_num_clients,
    cohort_indices,
    expected_period,
    solve_period,
)
from envs.split_cost import SplitCostModel, SplitOptions
from envs.split_engine import dense_attention_bytes, kv_staging_bytes

GPU = "split_a100-40gb_llama2-7b_tinyllama-1.1b"
CPU = "split_cpu_specsched-pair"  # measured (table) latencies


@pytest.fixture(scope="module")
def gpu():
    return load_profile(GPU)


def _rows_s(lat, b, per_row):  # envs.split_engine: b - 1 extra rows of bytes on the roofline's bandwidth
    return (b - 1) * per_row / (lat.bandwidth_efficiency * lat.device.bandwidth_bytes_per_s)


# ---------------------------------------------------------------- validation
@pytest.mark.parametrize("field", ["kv_staging_len", "dense_attention_len"])
def test_engine_lengths_accept_one_and_refuse_zero_bools_and_strings(field):
    assert getattr(SplitOptions(**{field: 1}), field) == 1
    for bad in (0, True, "2048", 2.5):
        with pytest.raises(ValueError, match=field):
            SplitOptions(**{field: bad})


def test_option_validation_bounds_and_messages():
    assert SplitOptions(proactive_depth=1).proactive_depth == 1
    for bad in (0, True, "3"):
        with pytest.raises(ValueError, match="proactive_depth"):
            SplitOptions(proactive_depth=bad)
    assert SplitOptions(bonus_match=0.0).bonus_match == 0.0 and SplitOptions(bonus_match=1.0).bonus_match == 1.0
    for bad in (True, "0.5", -0.1, 1.5):
        with pytest.raises(ValueError, match="bonus_match"):
            SplitOptions(bonus_match=bad)
    with pytest.raises(ValueError, match=r"'proactive' must be true or false, got 'false'"):
        SplitOptions(proactive="false")
    with pytest.raises(ValueError, match=r"'pipeline' must be true or false, got 1"):
        SplitOptions(pipeline=1)
    with pytest.raises(ValueError, match=r"'interrupt' must be one of \['step', 'immediate'\], got 'later'"):
        SplitOptions(interrupt="later")


def test_draft_tree_validation():
    for field in ("budget", "beams", "branch"):
        for bad in (0, True, "2"):
            with pytest.raises(ValueError, match=f"'{field}' must be an integer >= 1"):
                DraftTree(**{"budget": 4, field: bad})
    for bad in (0, "2", 1.5):
        with pytest.raises(ValueError, match="'depth' must be null or an integer >= 1"):
            DraftTree(4, depth=bad)
    assert DraftTree(4, depth=None).max_depth == 4 and DraftTree(4, depth=1).max_depth == 1
    c = DraftTree.chain(3)
    assert c == DraftTree(budget=3, beams=1, branch=1, depth=3) and c.depth == 3 and c.is_chain


def test_check_num_clients_refuses_bools_and_strings():
    assert check_num_clients(np.int64(3)) == 3
    for bad in (True, False, "2", 0, 1.0):
        with pytest.raises(ValueError, match="num_clients"):
            check_num_clients(bad)


def test_model_needs_both_edge_and_network_sections(gpu):
    for missing in ("edge", "network"):
        with pytest.raises(ValueError, match="needs 'edge' and 'network'"):
            SplitCostModel(dataclasses.replace(gpu, **{missing: None}))
    m = SplitCostModel(gpu)
    assert m.kv_budget_bytes == gpu.device.memory_bytes - gpu.device.reserve_bytes - gpu.llm.weight_bytes


def test_engine_switches_refuse_table_latencies_naming_option_and_profile():
    cpu = load_profile(CPU)
    tree = DraftTree.chain(3)
    with pytest.raises(ValueError, match=f"'kv_staging_len' needs roofline latencies; profile '{CPU}'"):
        SplitCostModel(cpu, SplitOptions(kv_staging_len=64)).verify_s(2, tree, 100.0)
    with pytest.raises(ValueError, match=f"'dense_attention_len' needs roofline latencies; profile '{CPU}'"):
        SplitCostModel(cpu, SplitOptions(dense_attention_len=64)).verify_s(2, tree, 100.0)


# ---------------------------------------------------------------- draft tree arithmetic
@pytest.mark.parametrize("g", [1, 4, 9])
def test_chain_at_full_acceptance_yields_every_draft_plus_bonus(g):
    chain = DraftTree.chain(g)
    assert tree_shape(1.0, chain).expected_tokens == g + 1
    assert np.array_equal(expected_tokens(np.array([1.0, 1.0]), chain), [g + 1.0, g + 1.0])
    assert float(expected_tokens(1.0, chain)) == g + 1
    assert not np.isnan(expected_tokens(np.array([0.5, 1.0]), chain)).any()


def test_chain_formula_is_exact_just_below_one():
    # at alpha = 1 - 1e-9 the closed form still applies: E = sum_{i<=g} alpha^i, which for g = 1000 is
    # 1001 - g (g + 1) / 2 * 1e-9 ~ 1001 - 5e-4 (not the alpha = 1 value g + 1)
    a, g = 1.0 - 1e-9, 1000
    direct = math.fsum(a**i for i in range(g + 1))
    assert direct < g + 1 - 4e-4
    assert tree_shape(a, DraftTree.chain(g)).expected_tokens == pytest.approx(direct, rel=1e-9, abs=0)
    assert float(expected_tokens(np.array([a]), DraftTree.chain(g))[0]) == pytest.approx(direct, rel=1e-9, abs=0)


def test_expected_tokens_of_an_empty_batch_is_empty():
    for tree in (DraftTree.chain(3), DraftTree(6, 2, 2, 3)):
        out = expected_tokens(np.array([]), tree)
        assert out.shape == (0,) and out.dtype == float


# ---------------------------------------------------------------- per-user components
def test_edge_prefill_is_one_batch_of_the_prompt(gpu):
    m = SplitCostModel(gpu)
    for n in (1, 17, 512):
        assert m.edge_prefill_s(n) == gpu.edge.tau_draft.tau1(1, n, n)
        assert m.edge_prefill_s(n) == pytest.approx(float(gpu.edge.tau_draft.tau(1, n, n)), rel=1e-12)


def test_server_only_verify_and_draft_with_specedge_engines_by_hand(gpu):
    span = 2048
    m = SplitCostModel(gpu, SplitOptions(dense_attention_len=span, kv_staging_len=span, proactive=False))
    lat_l, lat_s = gpu.tau_llm, gpu.tau_slm
    tree = DraftTree.chain(3)
    q, c = tree.verify_tokens, 100.0
    assert m.server_only_verify_s(0, tree, c) == 0.0 and m.verify_s(0, tree, c) == 0.0
    for b in (1, 2, 5):
        dense = _rows_s(lat_l, b, dense_attention_bytes(lat_l.model, span, c + q))
        assert b == 1 or dense > 0
        want = lat_l.tau1(b, q, c + q) + dense + _rows_s(lat_l, b, kv_staging_bytes(m.kv_l, m.kv_s, span, c, True))
        assert m.server_only_verify_s(b, tree, c) == pytest.approx(want, rel=1e-12)
        spec = lat_l.tau1(b, q, c + q) + dense + _rows_s(lat_l, b, kv_staging_bytes(m.kv_l, m.kv_s, span, c, False))
        assert m.verify_s(b, tree, c) == pytest.approx(spec, rel=1e-12)
    # server-only SD: T = sum_l [tau_S(n, 1, c + l) + dense(c + l)] + verify (a chain drafts one token per level)
    n, cmax = 3, 400.0
    draft = sum(lat_s.tau1(n, 1, c + i + 1) + _rows_s(lat_s, n, dense_attention_bytes(lat_s.model, span, c + i + 1)) for i in range(3))
    s = m.server_only(n, 0.7, tree, c, context_max=cmax)
    period = draft + m.server_only_verify_s(n, tree, c)
    assert s.iteration_s == pytest.approx(period, rel=1e-12)
    e = float(expected_tokens(0.7, tree))
    assert s.num_clients == n and s.verify_s == (s.iteration_s,) and s.edge_s == () and s.server_busy == 1.0
    assert s.tokens_per_iteration == pytest.approx(e, rel=1e-12)
    assert s.itl_s == pytest.approx(n * period / (n * e), rel=1e-12)
    assert s.throughput_tok_s == pytest.approx(n * e / period, rel=1e-12)
    mem = n * (cmax + q) * (m.kv_l + m.kv_s) + gpu.slm.weight_bytes
    assert s.memory_bytes == pytest.approx(mem, rel=1e-12) and s.fits_memory is (mem <= m.kv_budget_bytes)


def test_fits_memory_includes_the_exact_budget(gpu):
    m = SplitCostModel(gpu)
    tree = DraftTree.chain(3)
    cmax = m.kv_budget_bytes / m.kv_l - tree.verify_tokens  # one client's KV is exactly the budget
    s = m.steady_state(1, 0.7, tree, 100.0, context_max=cmax)
    assert s.memory_bytes == m.kv_budget_bytes and s.fits_memory
    assert not m.steady_state(1, 0.7, tree, 100.0, context_max=cmax + 1).fits_memory
    assert m.max_clients(cmax, tree) == 1 and m.max_clients(cmax + 1, tree) == 0
    so_cmax = (m.kv_budget_bytes - gpu.slm.weight_bytes) / (m.kv_l + m.kv_s) - tree.verify_tokens
    so = m.server_only(1, 0.7, tree, 100.0, context_max=so_cmax)
    assert so.memory_bytes == pytest.approx(m.kv_budget_bytes, rel=1e-15)
    assert so.fits_memory is (so.memory_bytes <= m.kv_budget_bytes)


def _mid_pass_wait(passes, k, frac=0.25):
    return sum(passes[:k]) + frac * passes[k]


def test_proactive_time_gain_both_interrupts_by_hand(gpu):
    alpha, c = 0.8, 200.0
    tree = DraftTree.chain(4)
    step = SplitCostModel(gpu)
    passes = [gpu.edge.tau_draft.tau1(1, 1, c + i + 1) for i in range(4)]
    assert step.edge_pass_s(tree_shape(alpha, tree), c) == pytest.approx(passes, rel=1e-12)
    p = alpha**4 * alpha
    wait = _mid_pass_wait(passes, 2)
    pro = step.proactive(alpha, tree, c, wait)
    done = passes[0] + passes[1]
    assert pro.reuse_probability == pytest.approx(p, rel=1e-12) and pro.levels == 2
    assert pro.done_s == pytest.approx(done, rel=1e-12) and pro.saved_s == pytest.approx(p * done, rel=1e-12)
    assert pro.delay_s == pytest.approx(done + passes[2] - wait, rel=1e-9)
    imm = SplitCostModel(gpu, SplitOptions(interrupt="immediate")).proactive(alpha, tree, c, wait)
    assert imm.delay_s == 0.0 and imm.levels == 2 and imm.done_s == pytest.approx(done, rel=1e-12)
    # a pass that finishes exactly when the verdict arrives is complete: no delay, its time saved on reuse
    exact = step.edge_pass_s(tree_shape(alpha, tree), c)[0]
    at = step.proactive(alpha, tree, c, exact)
    assert at.levels == 1 and at.done_s == exact and at.delay_s == pytest.approx(passes[1], rel=1e-12)
    off = SplitCostModel(gpu, SplitOptions(proactive=False)).proactive(alpha, tree, c, wait)
    assert (off.reuse_probability, off.saved_s, off.delay_s, off.done_s, off.levels) == (0.0, 0.0, 0.0, 0.0, 0)


@pytest.mark.parametrize("tree", [DraftTree.chain(4), DraftTree(4, 4, 4, 3, pass_width="kept")])
def test_proactive_tokens_gain_prices_the_proactive_subtree_after_the_verify_tokens(gpu, tree):
    alpha, c = 0.8, 200.0
    m = SplitCostModel(gpu, SplitOptions(proactive_gain="tokens", proactive_depth=3))
    sub = DraftTree.chain(3) if tree.is_chain else DraftTree(tree.budget, tree.beams, tree.branch, 3, pass_width=tree.pass_width)
    shape = tree_shape(alpha, sub)
    if not tree.is_chain:  # the kept widths (1, 2, 1), not the beam widths (1, 4, 4)
        assert shape.pass_widths == (1, 2, 1) and shape.level_nodes == (2, 1, 1)
    passes, done = [], 0
    for w, n in zip(shape.pass_widths, shape.level_nodes, strict=True):
        passes.append(gpu.edge.tau_draft.tau1(1, w, c + tree.verify_tokens + done + w))
        done += n
    wait = _mid_pass_wait(passes, 1, 0.5)
    pro = m.proactive(alpha, tree, c, wait)
    assert pro.levels == 1 and pro.saved_s == 0.0 and pro.done_s == 0.0
    assert pro.delay_s == pytest.approx(passes[0] + passes[1] - wait, rel=1e-9)


@pytest.mark.parametrize("levels", [-1, 0, 1, 2, None, 7])
def test_proactive_tokens_is_the_stationary_share_of_the_deepened_chain(gpu, levels):
    alpha, g, depth = 0.7, 3, 3
    m = SplitCostModel(gpu, SplitOptions(proactive_gain="tokens", proactive_depth=depth))
    h = depth if levels is None else min(depth, levels)

    def e(d):
        return (1 - alpha ** (d + 1)) / (1 - alpha)

    p0, ph = alpha**g * alpha, alpha ** (g + h) * alpha
    want = 0.0 if h <= 0 else p0 / (1 + p0 - ph) * (e(g + h) - e(g))
    assert m.proactive_tokens(alpha, DraftTree.chain(g), levels) == pytest.approx(want, rel=1e-12, abs=1e-15)
    assert h <= 0 or want > 0


def test_edge_iteration_expected_hit_and_miss(gpu):
    alpha, c, rtt = 0.8, 200.0, 0.004
    tree = DraftTree.chain(4)
    m = SplitCostModel(gpu)
    net = m.network_s(tree, rtt)
    draft = m.edge_draft_s(alpha, tree, c)
    passes = m.edge_pass_s(tree_shape(alpha, tree), c)
    wait = _mid_pass_wait(passes, 2)
    pro = m.proactive(alpha, tree, c, wait)
    assert pro.done_s > 0 and pro.delay_s > 0
    assert m.edge_iteration_s(alpha, tree, c, rtt, wait) == pytest.approx(draft - pro.saved_s + pro.delay_s + net, rel=1e-12)
    assert m.edge_iteration_s(alpha, tree, c, rtt, wait, reused=True) == pytest.approx(draft - pro.done_s + pro.delay_s + net, rel=1e-12)
    assert m.edge_iteration_s(alpha, tree, c, rtt, wait, reused=False) == pytest.approx(draft + pro.delay_s + net, rel=1e-12)
    # default wait: the lower bound network + a one-client verify
    low = net + m.verify_s(1, tree, c)
    assert m.verify_s(2, tree, c) != m.verify_s(1, tree, c)
    assert m.edge_iteration_s(alpha, tree, c, rtt) == m.edge_iteration_s(alpha, tree, c, rtt, low)
    assert m.edge_iteration_s(alpha, tree, c, rtt, low) != m.edge_iteration_s(alpha, tree, c, rtt, wait)


def test_max_clients_is_zero_when_one_client_does_not_fit(gpu):
    m = SplitCostModel(gpu)
    tree = DraftTree.chain(3)
    per = m.server_kv_bytes(4096.0, tree)
    assert m.max_clients(4096.0, tree) == int(m.kv_budget_bytes // per)
    assert m.max_clients(m.kv_budget_bytes / m.kv_l, tree) == 0


def test_max_clients_is_the_exact_floor_next_to_each_boundary(gpu):
    # N clients fit iff N x per-client KV <= the budget, counted exactly, also where budget / per rounds up to N
    m = SplitCostModel(gpu)
    tree = DraftTree.chain(3)
    budget = Fraction(m.kv_budget_bytes)
    for n in range(1, 13):
        base = m.kv_budget_bytes / (n * m.kv_l) - tree.verify_tokens
        for k in range(-40, 41):
            cmax = base * (1 + k * 1e-9)
            per = Fraction(m.server_kv_bytes(cmax, tree))
            got = m.max_clients(cmax, tree)
            assert got * per <= budget < (got + 1) * per, (n, k)


# ---------------------------------------------------------------- steady state
def test_steady_state_without_proactive_is_the_cohort_formula(gpu):
    m = SplitCostModel(gpu, SplitOptions(proactive=False))
    tree, c, cmax = DraftTree.chain(3), 300.0, 900.0
    alpha = np.array([0.6, 0.8, 0.7, 0.9, 0.5])
    rtt = np.array([0.002, 0.03, 0.004, 0.001, 0.05])
    s = m.steady_state(5, alpha, tree, c, rtt, context_max=cmax)  # pipelined by default
    va, vb = m.verify_s(3, tree, c), m.verify_s(2, tree, c)
    x = [m.edge_draft_s(a, tree, c) + m.network_s(tree, r) for a, r in zip(alpha, rtt, strict=True)]
    xa, xb = max(x[0], x[2], x[4]), max(x[1], x[3])
    t = max(va + vb, va + xa, vb + xb)
    e = expected_tokens(alpha, tree)
    assert s.num_clients == 5 and s.verify_s == pytest.approx((va, vb), rel=1e-12) and s.edge_s == pytest.approx((xa, xb), rel=1e-12)
    assert s.iteration_s == pytest.approx(t, rel=1e-12)
    assert s.itl_s == pytest.approx(5 * t / e.sum(), rel=1e-12) and s.throughput_tok_s == pytest.approx(e.sum() / t, rel=1e-12)
    assert s.server_busy == pytest.approx((va + vb) / t, rel=1e-12) and s.tokens_per_iteration == pytest.approx(e.mean(), rel=1e-12)
    mem = 5 * (cmax + tree.verify_tokens) * m.kv_l
    assert s.memory_bytes == pytest.approx(mem, rel=1e-12) and s.fits_memory is (mem <= m.kv_budget_bytes)
    one = m.steady_state(5, alpha, tree, c, rtt, pipeline=False)
    assert one.verify_s == pytest.approx((m.verify_s(5, tree, c),), rel=1e-12)
    assert one.iteration_s == pytest.approx(m.verify_s(5, tree, c) + max(x), rel=1e-12)
    two = m.steady_state(2, 0.7, tree, c)
    assert len(two.verify_s) == 2 and [list(i) for i in cohort_indices(2, True)] == [[0], [1]]


def test_steady_state_tokens_gain_counts_the_levels_drafted_in_the_final_waits(gpu):
    m = SplitCostModel(gpu, SplitOptions(proactive_gain="tokens", proactive_depth=3))
    tree, c = DraftTree.chain(2), 300.0
    s = m.steady_state(1, 0.8, tree, c, rtt_s=0.0)
    # a lone client waits network + verify; fewer than proactive_depth passes fit in it on this profile
    wait = m.network_s(tree, 0.0) + m.verify_s(1, tree, c)
    levels = m.proactive(0.8, tree, c, wait).levels
    assert 0 < levels < 3
    want = float(expected_tokens(0.8, tree)) + m.proactive_tokens(0.8, tree, levels)
    assert s.tokens_per_iteration == pytest.approx(want, rel=1e-9)


# ---------------------------------------------------------------- cohorts
def test_expected_period_each_term_of_the_max():
    one = (np.array([1.0]), np.array([1.0]))
    assert expected_period([2.0, 3.0], [one, one]) == 5.0  # V_A + V_B
    assert expected_period([2.0, 3.0], [(np.array([7.0]), np.array([1.0])), one]) == 9.0  # V_A + X_A
    assert expected_period([2.0, 3.0], [one, (np.array([7.0]), np.array([1.0]))]) == 10.0  # V_B + X_B
    # two-point X_A: 0.25 * max(5, 2 + 1, 3 + 1) + 0.75 * max(5, 2 + 7, 4)
    assert expected_period([2.0, 3.0], [(np.array([1.0, 7.0]), np.array([0.25, 0.75])), one]) == pytest.approx(0.25 * 5 + 0.75 * 9)
    assert expected_period([2.0], [(np.array([1.0, 7.0]), np.array([0.25, 0.75]))]) == pytest.approx(2 + 0.25 + 5.25)


def test_solve_period_starts_at_the_lower_bound_waits():
    calls = []

    def law(w):
        calls.append(np.array(w, dtype=float))
        return [Proactive(0.0, 0.0, 0.0)] * len(w)

    draft, net = np.array([0.01, 0.02, 0.03]), np.array([0.001, 0.002, 0.003])
    solve_period([0.5, 0.25], cohort_indices(3, True), draft, net, law, 1)
    assert np.array_equal(calls[0], [0.501, 0.252, 0.503])


def test_solve_period_converges_to_the_fixed_point_of_the_waits():
    # one cohort of two; client 1 always the slowest (so the period is V + its miss from the first round),
    # client 0 reuses with p = 0.5 and has finished 0.8 x its wait of proactive passes; client 1 has an interrupt delay
    v, draft, net = 0.01, np.array([0.004, 0.2]), np.array([0.002, 0.002])
    calls = []

    def law(w):
        calls.append(np.array(w, dtype=float))
        return [Proactive(0.5, 0.4 * w[0], 0.0, 0.8 * w[0], 1), Proactive(0.0, 0.0, 0.003, 0.0, 0)]

    period, edge, wait = solve_period([v], [np.arange(2)], draft, net, law, 200)
    miss1 = 0.2 + 0.003 + 0.002
    assert period == pytest.approx(v + miss1, rel=1e-12) and edge == pytest.approx((miss1,), rel=1e-12)
    # wait = max(T - (draft + delay - p done), net), at its fixed point (0.4 x w0 a contraction)
    w0 = (period - 0.004) / (1 - 0.4)
    assert wait == pytest.approx([w0, max(period - 0.2 - 0.003, 0.002)], rel=1e-11)
    assert np.array_equal(wait, calls[-1])  # the waits returned are those the last law was priced at


# ---------------------------------------------------------------- calibrated depth
def _brute_depth(m, alpha, c, rtt, verify_clients, max_depth, tree=None):
    best, best_gap = None, math.inf
    for g in range(1, max_depth + 1):
        shape = DraftTree.chain(g) if tree is None else DraftTree(tree.budget, tree.beams, tree.branch, g)
        gap = abs(m.edge_iteration_s(alpha, shape, c, rtt) - m.verify_s(verify_clients, shape, c))
        if gap <= best_gap:  # ties go to the deeper draft
            best, best_gap = g, gap
    return best


def test_calibrated_depth_is_the_brute_force_over_one_to_max_depth(gpu):
    m = SplitCostModel(gpu)
    c = 300.0
    alpha, rtt = np.array([0.5, 0.8, 0.95, 0.8]), np.array([0.0, 0.001, 0.01, 0.05])
    got = m.calibrated_depth(alpha, c, rtt)  # defaults: one verify client, max_depth 8
    want = [_brute_depth(m, float(a), c, float(r), 1, 8) for a, r in zip(alpha, rtt, strict=True)]
    assert got.tolist() == want and np.issubdtype(got.dtype, np.integer)
    assert m.calibrated_depth(0.8, c) == _brute_depth(m, 0.8, c, gpu.network.rtt_s, 1, 8)  # the profile's RTT
    assert isinstance(m.calibrated_depth(0.8, c), int)
    assert m.calibrated_depth(0.5, c, 0.0, max_depth=3) == _brute_depth(m, 0.5, c, 0.0, 1, 3) == 3
    assert m.calibrated_depth(0.5, c, 0.0, max_depth=1) == 1
    assert m.calibrated_depth(0.8, c, 0.0, verify_clients=8) == _brute_depth(m, 0.8, c, 0.0, 8, 8)
    for bad in (0, -2, 2.0, "8"):
        with pytest.raises(ValueError, match="max_depth must be an integer >= 1"):
            m.calibrated_depth(0.8, c, max_depth=bad)
    # a given tree keeps its budget, beams and branch; past its last level every depth ties: the deepest wins
    tree = DraftTree(24, 4, 4, 4)
    assert m.calibrated_depth(0.8, c, 0.0, tree=tree) == _brute_depth(m, 0.8, c, 0.0, 1, 8, tree) == 3
    assert m.calibrated_depth(0.8, c, 0.0, verify_clients=32, max_depth=16, tree=tree) == _brute_depth(m, 0.8, c, 0.0, 32, 16, tree) == 16


def test_calibrated_depth_default_max_is_eight():
    m = SplitCostModel(load_profile(CPU))  # a draft far faster than the verify: the deepest allowed depth wins
    assert m.calibrated_depth(0.8, 300.0, 0.0) == _brute_depth(m, 0.8, 300.0, 0.0, 1, 8) == 8
    assert m.calibrated_depth(0.8, 300.0, 0.0, max_depth=12) == 12


def test_calibrated_depth_defaults_to_the_profiles_rtt(gpu):
    near = SplitCostModel(dataclasses.replace(gpu, network=dataclasses.replace(gpu.network, rtt_ms=0.0)))
    assert near.calibrated_depth(0.8, 300.0) == near.calibrated_depth(0.8, 300.0, 0.0) == _brute_depth(near, 0.8, 300.0, 0.0, 1, 8) > 1
