"""The split mode's closed form (envs.split_cost) against hand-derived values and its own invariants."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import envs.draft_tree as draft_tree
from envs.profile import load_profile
from envs.split_cost import DraftTree, SplitCostModel, SplitOptions, expected_tokens, tree_shape

GPU = "split_a100-40gb_qwen3-14b_qwen3-1.7b"
TREE = DraftTree(budget=32, beams=32, branch=16, depth=8)


@pytest.fixture(scope="module")
def model():
    return SplitCostModel(load_profile(GPU))


@settings(max_examples=60, deadline=None)
@given(st.floats(0.0, 0.999), st.integers(1, 12))
def test_chain_expected_tokens_is_the_closed_form_and_the_tree_model_reduces_to_it(alpha, g):
    closed = (1 - alpha ** (g + 1)) / (1 - alpha)
    assert float(expected_tokens(alpha, DraftTree.chain(g))) == pytest.approx(closed, rel=1e-12)
    # a "tree" with one beam and one child per node is the chain, through the general best-first path
    shape = tree_shape(alpha, DraftTree(budget=g, beams=1, branch=2, depth=g))
    assert shape.expected_tokens >= closed - 1e-12  # a second child per node can only add


@pytest.mark.parametrize("g", [1, 4, 12])
def test_chain_accepts_everything_at_alpha_one(g):
    """At acceptance 1 every draft is accepted: g + 1 tokens per iteration (the closed form's 0/0
    limit), from both the scalar shape and the numpy path, and continuous from below. The shapes'
    cache is cleared first: an entry computed earlier in the process (mutmut's forked runs inherit
    its parent's) would answer without running the code under test."""
    draft_tree._shape.cache_clear()
    chain = DraftTree.chain(g)
    assert tree_shape(1.0, chain).expected_tokens == g + 1.0
    assert float(expected_tokens(1.0, chain)) == g + 1.0
    assert tree_shape(1.0 - 1e-6, chain).expected_tokens == pytest.approx(g + 1.0, rel=1e-4)
    assert tree_shape(1.0, chain).top_path_prob == 1.0


@settings(max_examples=40, deadline=None)
@given(st.floats(0.05, 0.95), st.integers(1, 40), st.integers(1, 8), st.integers(1, 8), st.integers(1, 10))
def test_tree_shape_invariants(alpha, budget, beams, branch, depth):
    tree = DraftTree(budget, beams, branch, depth)
    s = tree_shape(alpha, tree)
    assert sum(s.level_nodes) <= budget and len(s.level_nodes) <= depth
    assert 1.0 <= s.expected_tokens <= len(s.level_nodes) + 1 + 1e-9
    # the per-level conditional acceptances rebuild the expectation (what the DES consumes)
    assert 1.0 + float(np.cumprod(s.level_accept).sum()) == pytest.approx(s.expected_tokens, rel=1e-9)
    assert s.pass_widths[0] == 1 and all(w <= beams for w in s.pass_widths)
    # more budget never hurts
    assert tree_shape(alpha, DraftTree(budget + 1, beams, branch, depth)).expected_tokens >= s.expected_tokens - 1e-12


def test_hand_derived_small_tree():
    # alpha 0.5: p1 = 0.5, p2 = 0.25. Budget 3, two children, depth 2: best nodes 0.5 (a), 0.25 (a's child
    # and the root's 2nd child tie); all three drafted: E = 1 + 0.5 + 0.25 + 0.25 = 2.0
    s = tree_shape(0.5, DraftTree(budget=3, beams=2, branch=2, depth=2))
    assert s.expected_tokens == pytest.approx(2.0)
    assert sum(s.level_nodes) == 3


def test_edge_network_and_verify_components_by_hand(model):
    p = model.profile
    c = 300.0
    g = 3
    tree = DraftTree.chain(g)
    expect_draft = sum(p.edge.tau_draft.tau1(1, 1, c + i + 1) for i in range(g))
    assert model.edge_draft_s(0.8, tree, c) == pytest.approx(expect_draft, rel=1e-12)
    net = p.network
    bytes_total = 2 * net.request_overhead_bytes + (g + 1) * (net.bytes_per_draft_token + net.bytes_per_reply_token)
    assert model.network_s(tree, 0.04) == pytest.approx(0.04 + bytes_total / net.bandwidth_bytes_per_s)
    assert model.network_s(tree) == pytest.approx(net.rtt_s + bytes_total / net.bandwidth_bytes_per_s)
    assert model.verify_s(5, tree, c) == pytest.approx(p.tau_llm.tau1(5, g + 1, c + g + 1))
    assert model.verify_s(0, tree, c) == 0.0


def test_proactive_reuse_probability_and_saving(model):
    tree = DraftTree.chain(4)
    assert model.reuse_probability(0.8, tree) == pytest.approx(0.8**4 * 0.8)
    fixed = SplitCostModel(model.profile, SplitOptions(bonus_match=0.5))
    assert fixed.reuse_probability(0.8, tree) == pytest.approx(0.8**4 * 0.5)
    passes = model.edge_pass_s(tree_shape(0.8, tree), 200.0)
    long_wait = model.proactive(0.8, tree, 200.0, wait_s=10.0)
    assert long_wait.saved_s == pytest.approx(0.8**5 * sum(passes)) and long_wait.delay_s == 0.0
    # a wait of 1.5 passes: one pass saved on reuse, half a pass of delay (the "step" interrupt)
    mid = model.proactive(0.8, tree, 200.0, wait_s=passes[0] + 0.5 * passes[1])
    assert mid.saved_s == pytest.approx(0.8**5 * passes[0])
    assert mid.delay_s == pytest.approx(0.5 * passes[1])
    off = SplitCostModel(model.profile, SplitOptions(proactive=False)).proactive(0.8, tree, 200.0, 10.0)
    assert off.saved_s == 0.0 and off.delay_s == 0.0


def test_steady_state_one_cohort_and_two_cohorts_by_hand(model):
    opts = SplitOptions(proactive=False)
    m = SplitCostModel(model.profile, opts)
    tree, c, n, a = DraftTree.chain(4), 400.0, 10, 0.7
    x = m.edge_draft_s(a, tree, c) + m.network_s(tree)
    e = (1 - a**5) / (1 - a)
    one = m.steady_state(n, a, tree, c, pipeline=False)
    t1 = m.verify_s(n, tree, c) + x
    assert one.iteration_s == pytest.approx(t1)
    assert one.throughput_tok_s == pytest.approx(n * e / t1)
    assert one.itl_s == pytest.approx(t1 / e)
    two = m.steady_state(n, a, tree, c, pipeline=True)
    v = m.verify_s(5, tree, c)
    t2 = max(2 * v, v + x)
    assert two.iteration_s == pytest.approx(t2)
    assert two.server_busy == pytest.approx(2 * v / t2)
    assert two.throughput_tok_s >= one.throughput_tok_s  # pipelining never hurts here


def test_steady_state_with_proactive_is_no_slower_when_the_wait_covers_the_draft(model):
    tree, c = DraftTree.chain(3), 400.0
    with_p = model.steady_state(8, 0.9, tree, c, pipeline=False)
    without = SplitCostModel(model.profile, SplitOptions(proactive=False, interrupt="immediate")).steady_state(8, 0.9, tree, c, pipeline=False)
    assert with_p.iteration_s <= without.iteration_s + 1e-12


def test_server_only_by_hand(model):
    p = model.profile
    tree, c, n = DraftTree.chain(3), 256.0, 4
    draft = sum(p.tau_slm.tau1(n, 1, c + i + 1) for i in range(3))
    period = draft + p.tau_llm.tau1(n, 4, c + 4)
    so = model.server_only(n, 0.8, tree, c)
    assert so.iteration_s == pytest.approx(period)
    assert so.throughput_tok_s == pytest.approx(n * (1 - 0.8**4) / 0.2 / period)


def test_memory(model):
    tree = DraftTree.chain(4)
    per = model.server_kv_bytes(1000, tree)
    assert per == pytest.approx(1005 * model.profile.kv_llm_bytes)
    k = model.max_clients(1000, tree)
    assert k * per <= model.kv_budget_bytes < (k + 1) * per
    ss = model.steady_state(k + 1, 0.8, tree, 500, context_max=1000)
    assert not ss.fits_memory


def test_calibrated_depth_is_the_brute_force_argmin(model):
    alphas, rtts = np.array([0.6, 0.8, 0.95]), np.array([0.005, 0.015, 0.06])
    got = model.calibrated_depth(alphas, 512.0, rtts, verify_clients=16, max_depth=8)
    for a, r, g in zip(alphas, rtts, got, strict=True):
        gaps = [abs(model.edge_iteration_s(a, DraftTree.chain(d), 512.0, r) - model.verify_s(16, DraftTree.chain(d), 512.0)) for d in range(1, 9)]
        best = max(d for d in range(1, 9) if gaps[d - 1] == min(gaps))
        assert g == best
    assert isinstance(model.calibrated_depth(0.8, 512.0), int)


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="budget"):
        DraftTree(budget=0)
    with pytest.raises(ValueError, match="bonus_match"):
        SplitOptions(bonus_match=1.5)
    with pytest.raises(ValueError, match="edge"):
        SplitCostModel(load_profile("rtx4090_llama2-7b_tinyllama-1.1b"))
    with pytest.raises(ValueError, match="num_clients"):
        SplitCostModel(load_profile(GPU)).steady_state(0, 0.8, TREE, 100)
    assert math.isfinite(SplitCostModel(load_profile(GPU)).steady_state(3, 0.8, TREE, 100).itl_s)


def test_calibrated_tree_depth_grows_with_the_verify_pass(model):
    # a bigger verify cohort takes longer, so the edge can afford a deeper tree in the same time
    small = model.calibrated_depth(0.8, 512.0, 0.015, verify_clients=1, max_depth=12, tree=TREE)
    large = model.calibrated_depth(0.8, 512.0, 0.015, verify_clients=64, max_depth=12, tree=TREE)
    assert 1 <= small <= large <= 12


def test_pass_widths_beam_search_and_kept_tree():
    beams = tree_shape(0.8, TREE)
    kept = tree_shape(0.8, DraftTree(32, 32, 16, 8, pass_width="kept"))
    assert beams.pass_widths[:3] == (1, 16, 32) and all(w == 32 for w in beams.pass_widths[2:])
    assert all(k <= b for k, b in zip(kept.pass_widths, beams.pass_widths, strict=True))
    assert beams.expected_tokens == kept.expected_tokens  # what is accepted does not depend on what was forwarded
    with pytest.raises(ValueError, match="pass_width"):
        DraftTree(4, pass_width="wide")


def test_cohort_edge_time_is_the_expected_maximum_of_random_reuse():
    from envs.split_cohorts import max_of_two_point

    # two clients: hit 1 / miss 3 with p = 0.5, and hit 2 / miss 2.5 with p = 0.2
    vals, probs = max_of_two_point(np.array([1.0, 2.0]), np.array([3.0, 2.5]), np.array([0.5, 0.2]))
    # max = 3 unless client 1 hits (0.5); then 2 if client 2 hits (0.2) else 2.5
    assert dict(zip(vals.tolist(), probs.tolist(), strict=True)) == pytest.approx({2.0: 0.1, 2.5: 0.4, 3.0: 0.5})


def test_proactive_saves_for_one_client_and_almost_nothing_for_a_large_cohort(model):
    tree, c = DraftTree.chain(4), 384.0
    off = SplitCostModel(model.profile, SplitOptions(proactive=False))
    one_on, one_off = model.steady_state(1, 0.8, tree, c), off.steady_state(1, 0.8, tree, c)
    assert one_on.iteration_s < one_off.iteration_s  # a lone client gains p * (passes done in the wait)
    many_on, many_off = model.steady_state(40, 0.8, tree, c, pipeline=False), off.steady_state(40, 0.8, tree, c, pipeline=False)
    assert many_on.iteration_s == pytest.approx(many_off.iteration_s, rel=1e-6)  # 0.8^5 ^ 40: nobody waits less


def test_proactive_gain_tokens_deepens_the_tree_and_saves_no_edge_time(model):
    """SpecEdge's default `excluded` proactive type: a reuse buys a deeper tree, not saved passes."""
    tree, c = DraftTree(32, 32, 16, 4), 640.0
    tokens = SplitCostModel(model.profile, SplitOptions(proactive_gain="tokens"))
    off = SplitCostModel(model.profile, SplitOptions(proactive=False, proactive_gain="tokens"))
    long_wait = tokens.proactive(0.8, tree, c, wait_s=10.0)
    assert long_wait.saved_s == 0.0 and long_wait.done_s == 0.0 and long_wait.levels == 3  # every proactive level drafted, none saved
    assert tokens.proactive(0.8, tree, c, wait_s=0.0).levels == 0
    deeper = tree_shape(0.8, DraftTree(32, 32, 16, 7)).expected_tokens - tree_shape(0.8, tree).expected_tokens
    p0, p3 = tokens.reuse_probability(0.8, tree), tokens.reuse_probability(0.8, DraftTree(32, 32, 16, 7))
    assert p3 < p0 and tokens.proactive_tokens(0.8, tree) == pytest.approx(p0 / (1 + p0 - p3) * deeper)  # stationary share of deepened trees
    assert tokens.proactive_tokens(0.8, tree, levels=0) == 0.0 and model.proactive_tokens(0.8, tree) == 0.0  # default "time": no token gain
    on, no = tokens.steady_state(2, 0.8, tree, c, rtt_s=0.015), off.steady_state(2, 0.8, tree, c, rtt_s=0.015)
    assert on.tokens_per_iteration > no.tokens_per_iteration and on.throughput_tok_s > no.throughput_tok_s
    # the default ("time") keeps the tree's own expected tokens
    assert model.steady_state(2, 0.8, tree, c, rtt_s=0.015).tokens_per_iteration == pytest.approx(tree_shape(0.8, tree).expected_tokens)
    with pytest.raises(ValueError, match="proactive_gain"):
        SplitOptions(proactive_gain="both")
    with pytest.raises(ValueError, match="proactive_depth"):
        SplitOptions(proactive_depth=0)


def test_server_only_padded_widths_forward_every_level_at_full_beam_width():
    # SpecEdge's server-only engine: one CUDA graph at (batch, beams), all `depth` levels (envs.split_cost, "SpecEdge's engines")
    p = load_profile(GPU)
    tree, c, n = DraftTree(budget=32, beams=32, branch=16, depth=4), 640.0, 8
    padded = SplitCostModel(p, SplitOptions(server_only_widths="padded"))
    shape = tree_shape(0.8, tree)
    draft, done = 0.0, 0
    for nodes in shape.level_nodes:
        draft += p.tau_slm.tau1(n, 32, c + done + 32)
        done += nodes
    assert padded.server_only(n, 0.8, tree, c).iteration_s == pytest.approx(draft + p.tau_llm.tau1(n, 33, c + 33))
    plain = SplitCostModel(p).server_only(n, 0.8, tree, c).iteration_s
    assert shape.pass_widths[0] == 1 and plain < draft + p.tau_llm.tau1(n, 33, c + 33)  # the tree's own widths start at 1
    chain = DraftTree.chain(3)  # a chain is one beam wide either way
    assert padded.server_only(n, 0.8, chain, c).iteration_s == pytest.approx(SplitCostModel(p).server_only(n, 0.8, chain, c).iteration_s)


def test_dense_attention_prices_max_len_slots_and_the_gqa_copy_per_extra_row():
    p = load_profile(GPU)
    dense, plain = SplitCostModel(p, SplitOptions(dense_attention_len=2048)), SplitCostModel(p)
    tree, c = DraftTree(budget=32, beams=32, branch=16, depth=4), 640.0
    assert dense.verify_s(1, tree, c) == plain.verify_s(1, tree, c)  # the batch-1 pass is taken as given
    # Qwen3-14B: 40 layers, 8 KV heads, 40 heads, head_dim 128, fp16: read K/V, write and re-read the expanded copy, less the context's KV read
    per_row = 40 * 2 * 2048 * 128 * 2 * (8 + 2 * 40) - (c + 33) * 2 * 40 * 8 * 128 * 2
    bw = p.tau_llm.bandwidth_efficiency * p.device.bandwidth_bytes_per_s
    assert dense.verify_s(4, tree, c) - plain.verify_s(4, tree, c) == pytest.approx(3 * per_row / bw)
    assert 2.5e-3 < per_row / bw < 3.5e-3  # ~3 ms per extra row on the A100
    # without grouped-query attention repeat_kv copies nothing: Llama-2-7B reads only its own K/V over max_len
    mha = load_profile("split_a100-40gb_llama2-7b_tinyllama-1.1b")
    m = SplitCostModel(mha, SplitOptions(dense_attention_len=2048))
    per_row = 32 * 2 * 2048 * 128 * 2 * 32 - (c + 5) * mha.kv_llm_bytes
    got = m.verify_s(2, DraftTree.chain(4), c) - SplitCostModel(mha).verify_s(2, DraftTree.chain(4), c)
    assert got == pytest.approx(per_row / (mha.tau_llm.bandwidth_efficiency * mha.device.bandwidth_bytes_per_s))


def test_engine_switches_are_checked_and_named():
    with pytest.raises(ValueError, match="server_only_widths"):
        SplitOptions(server_only_widths="wide")
    with pytest.raises(ValueError, match="dense_attention_len"):
        SplitOptions(dense_attention_len=0)
    cpu = SplitCostModel(load_profile("split_cpu_specsched-pair"), SplitOptions(dense_attention_len=2048))
    with pytest.raises(ValueError, match="dense_attention_len"):  # a measured table has no bandwidth to price bytes at
        cpu.verify_s(2, DraftTree.chain(2), 100.0)


def test_kv_staging_charges_specedge_whole_rows_and_server_only_compaction():
    # SpecEdge's server copies each client's whole max_len KV in and out around the verify; server-only SD only compacts (both caches)
    p = load_profile(GPU)
    staged, plain = SplitCostModel(p, SplitOptions(kv_staging_len=2048)), SplitCostModel(p)
    tree, c, b = DraftTree(budget=32, beams=32, branch=16, depth=4), 640.0, 4
    bw = p.tau_llm.bandwidth_efficiency * p.device.bandwidth_bytes_per_s
    kv_l, kv_s = 2 * 40 * 8 * 128 * 2, 2 * 28 * 8 * 128 * 2  # Qwen3-14B and Qwen3-1.7B, fp16, bytes per token
    assert staged.verify_s(1, tree, c) == plain.verify_s(1, tree, c)
    assert staged.verify_s(b, tree, c) - plain.verify_s(b, tree, c) == pytest.approx((b - 1) * kv_l * (6 * 2048 + c) / bw)
    assert staged.server_only_verify_s(b, tree, c) - plain.server_only_verify_s(b, tree, c) == pytest.approx((b - 1) * (kv_l + kv_s) * (2048 + c) / bw)
    # it works against SpecEdge: its verify grows more per row than server-only's
    assert staged.verify_s(b, tree, c) > staged.server_only_verify_s(b, tree, c)
    assert staged.server_only(b, 0.8, tree, c).iteration_s > plain.server_only(b, 0.8, tree, c).iteration_s
    with pytest.raises(ValueError, match="kv_staging_len"):
        SplitOptions(kv_staging_len=-1)
