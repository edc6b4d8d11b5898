"""The split-serving discrete-event simulation on hand-checkable primitives (envs.split_des)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envs.split_des import simulate
from envs.split_des_config import DesConfig, DesConfigError, DraftShape, SplitPrimitives


def linear_verify(b: int, q: int, c: float) -> float:
    return 0.02 + 0.0005 * b * q + 1e-6 * b * c


def prim(rtt_s: float = 0.015, draft_s: float = 0.004, **kw) -> SplitPrimitives:
    return SplitPrimitives(verify_s=linear_verify, draft_pass_s=lambda w, c: draft_s * w, rtt_s=rtt_s, **kw)


def test_one_cohort_iteration_is_draft_plus_network_plus_verify():
    # alpha = 0 keeps every client at the same context, so the verify pass is known exactly
    cfg = DesConfig(num_clients=8, shape=DraftShape.chain(3, 0.0), cohorts=1, proactive=False, iterations=30, warmup_iterations=5)
    res = simulate(cfg, prim())
    # contexts restart at the prompt after output_tokens; alpha = 0 gains one token per iteration
    ctx = cfg.prompt_tokens + (np.arange(cfg.warmup_iterations + cfg.iterations) % cfg.output_tokens)
    expected = 3 * 0.004 + 0.015 + np.array([linear_verify(8, 4, c + 4) for c in ctx])
    got = res.records["reply_s"][res.records["client"] == 0]
    assert np.allclose(np.diff(got)[cfg.warmup_iterations:], expected[cfg.warmup_iterations + 1:], rtol=1e-9)
    assert res.summary["mean_batch"] == 8
    assert res.summary["tokens_per_iteration"] == 1.0


def test_two_cohorts_alternate_and_the_server_is_the_bottleneck_when_verify_dominates():
    cfg = DesConfig(num_clients=16, shape=DraftShape.chain(4, 0.0), cohorts=2, proactive=False, iterations=40)
    res = simulate(cfg, prim(draft_s=0.001, rtt_s=0.002))
    v = linear_verify(8, 5, cfg.prompt_tokens + 30 + 5)  # contexts here are prompt + 20..60
    # each cohort's period is two verify passes (the server alternates between the cohorts)
    assert res.summary["server_busy_fraction"] == pytest.approx(1.0, abs=1e-6)
    assert res.summary["iteration_s"] == pytest.approx(2 * v, rel=0.01)
    assert res.summary["mean_batch"] == 8


def test_two_cohorts_when_drafting_dominates_the_client_cycle_is_unchanged():
    cfg = DesConfig(num_clients=4, shape=DraftShape.chain(4, 0.0), cohorts=2, proactive=False, iterations=40)
    res = simulate(cfg, prim(draft_s=0.02, rtt_s=0.03))
    v = linear_verify(2, 5, cfg.prompt_tokens + 30 + 5)
    assert res.summary["iteration_s"] == pytest.approx(4 * 0.02 + 0.03 + v, rel=0.01)
    assert res.summary["server_busy_fraction"] < 0.5


def test_proactive_with_certain_reuse_hides_drafting_behind_the_verification():
    # alpha = 1 and a certain bonus match: every block is reused; the wait (rtt + verify) is longer
    # than one block, so the next block is always complete when the verdict comes
    shape = DraftShape.chain(4, 1.0)
    cfg = DesConfig(num_clients=4, shape=shape, cohorts=1, proactive=True, bonus_match=1.0, iterations=40)
    res = simulate(cfg, prim(draft_s=0.004, rtt_s=0.03))
    keep = res.records["iteration"] >= cfg.warmup_iterations
    assert res.records["reused"][keep].all()
    assert (res.records["proactive_passes"][keep] == 4).all()
    wait = res.records["reply_s"] - res.records["sent_s"]
    cycle = res.summary["iteration_s"]
    assert cycle == pytest.approx(float(wait[keep].mean()), rel=1e-6)  # no drafting on the critical path
    off = simulate(DesConfig(num_clients=4, shape=shape, cohorts=1, proactive=False, iterations=40), prim(draft_s=0.004, rtt_s=0.03))
    assert off.summary["iteration_s"] == pytest.approx(cycle + 4 * 0.004, rel=0.01)


def test_proactive_never_reuses_without_a_bonus_match_or_full_acceptance():
    for alpha, match in ((1.0, 0.0), (0.0, 1.0)):
        cfg = DesConfig(num_clients=2, shape=DraftShape.chain(2, alpha), cohorts=1, proactive=True, bonus_match=match, iterations=20)
        res = simulate(cfg, prim())
        assert not res.records["reused"].any()
        off = simulate(DesConfig(num_clients=2, shape=DraftShape.chain(2, alpha), cohorts=1, proactive=False, iterations=20), prim())
        assert res.summary["iteration_s"] == pytest.approx(off.summary["iteration_s"], rel=0.05)


def test_immediate_interrupt_is_never_slower_than_finishing_the_pass_in_flight():
    shape = DraftShape.chain(6, 0.5)
    base = dict(num_clients=3, shape=shape, cohorts=1, proactive=True, bonus_match=0.5, iterations=60, seed=3)
    step = simulate(DesConfig(**base, proactive_interrupt="step"), prim(draft_s=0.007, rtt_s=0.01))
    now = simulate(DesConfig(**base, proactive_interrupt="immediate"), prim(draft_s=0.007, rtt_s=0.01))
    assert now.summary["iteration_s"] <= step.summary["iteration_s"] * (1 + 1e-9)


@settings(max_examples=15, deadline=None)
@given(alpha=st.floats(0.0, 1.0), depth=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_tokens_per_iteration_match_the_acceptance_model(alpha, depth, seed):
    shape = DraftShape.chain(depth, alpha)
    cfg = DesConfig(num_clients=4, shape=shape, cohorts=2, proactive=False, iterations=150, warmup_iterations=0, seed=seed)
    res = simulate(cfg, prim(draft_s=0.001, rtt_s=0.0))
    n = 4 * 150
    # tokens per iteration lie in [1, depth + 1]; the mean is within 5 standard errors of E
    # (the model's own standard deviation: P(accepted >= d) = alpha^d)
    s = np.concatenate([[1.0], np.cumprod(shape.level_accept), [0.0]])
    pmf = s[:-1] - s[1:]
    tokens = np.arange(1, depth + 2)
    sd = math.sqrt(max(float(pmf @ tokens**2 - (pmf @ tokens) ** 2), 0.0))
    assert res.records["tokens"].min() >= 1 and res.records["tokens"].max() <= depth + 1
    assert abs(res.summary["tokens_per_iteration"] - shape.expected_tokens()) <= 5 * sd / math.sqrt(n) + 1e-9


def test_jitter_costs_a_synchronised_cohort_the_expected_maximum_of_its_delays():
    shape = DraftShape.chain(2, 0.0)
    quiet = simulate(DesConfig(num_clients=8, shape=shape, cohorts=1, proactive=False, iterations=80), prim())
    noisy = simulate(DesConfig(num_clients=8, shape=shape, cohorts=1, proactive=False, iterations=80), prim(rtt_jitter_s=0.003))
    # the server waits for the slowest uplink of 8: E[max of 8 normals] ~ 1.42 sd, plus the own downlink
    extra = noisy.summary["iteration_s"] - quiet.summary["iteration_s"]
    assert 0.5 * 1.42 * 0.003 < extra < 2.0 * 1.42 * 0.003


def test_a_tree_shape_verifies_its_whole_budget_and_drafts_its_passes():
    shape = DraftShape("tree", (1, 8, 8), verify_tokens=17, level_accept=(0.9, 0.7, 0.5))
    assert shape.expected_tokens() == pytest.approx(1 + 0.9 + 0.63 + 0.315)
    cfg = DesConfig(num_clients=2, shape=shape, cohorts=1, proactive=False, iterations=10)
    res = simulate(cfg, prim(draft_s=0.001, rtt_s=0.0))
    keep = res.records["iteration"] >= 1
    draft = (res.records["sent_s"] - res.records["draft_start_s"])[keep]
    assert np.allclose(draft, 0.001 * 17)


def test_transfers_add_bytes_over_bandwidth_each_way():
    shape = DraftShape.chain(3, 0.0)
    cfg = DesConfig(num_clients=1, shape=shape, cohorts=1, proactive=False, iterations=10)
    slow = prim(bandwidth_bytes_per_s=1e5, bytes_per_draft_token=100, bytes_per_reply_token=50, request_overhead_bytes=1000)
    a = simulate(cfg, slow).summary["iteration_s"]
    b = simulate(cfg, prim()).summary["iteration_s"]
    assert a - b == pytest.approx((1000 + 400) / 1e5 + (1000 + 200) / 1e5, rel=1e-6)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(num_clients=0), "num_clients"),
        (dict(cohorts=3), "cohorts"),
        (dict(num_clients=1, cohorts=2), "cohorts"),
        (dict(bonus_match=1.5), "bonus_match"),
        (dict(proactive_interrupt="never"), "proactive_interrupt"),
        (dict(batch_window_s=-1.0), "batch_window_s"),
        (dict(iterations=0), "iterations"),
    ],
)
def test_bad_settings_name_the_field(kwargs, field):
    base = dict(num_clients=4, shape=DraftShape.chain(2, 0.5))
    with pytest.raises(DesConfigError, match=field):
        DesConfig(**{**base, **kwargs})


def test_bad_shapes_and_primitives_name_the_field():
    with pytest.raises(DesConfigError, match="level_accept"):
        DraftShape("chain", (1,), 2, (1.2,))
    with pytest.raises(DesConfigError, match="verify_tokens"):
        DraftShape("tree", (1, 4), 2, (0.5, 0.5))
    with pytest.raises(DesConfigError, match="kind"):
        DraftShape("dag", (1,), 2, (0.5,))
    with pytest.raises(DesConfigError, match="rtt_s"):
        prim(rtt_s=-0.001)
    with pytest.raises(DesConfigError, match="bandwidth"):
        prim(bandwidth_bytes_per_s=0.0)


def test_tokens_gain_deepens_the_next_tree_and_saves_no_drafting():
    """SpecEdge's `excluded` proactive type: a reuse means a deeper verified tree, never skipped passes."""
    base, deep1, deep2 = DraftShape.chain(2, 1.0), DraftShape.chain(3, 1.0), DraftShape.chain(4, 1.0)
    common = dict(num_clients=1, shape=base, cohorts=1, bonus_match=1.0, iterations=30, warmup_iterations=5)
    slow = prim(rtt_s=0.05, draft_s=0.004)  # the wait (network + verify) fits both proactive passes
    res = simulate(DesConfig(**common, proactive_gain="tokens", proactive_shape=DraftShape.chain(2, 1.0), deepened=(deep1, deep2)), slow)
    off = simulate(DesConfig(**common, proactive=False), slow)
    r = res.records
    kept = r["iteration"] >= 5
    # alpha = 1: every iteration is reused, so after the first every tree is deepened by both proactive levels
    assert (r["tokens"][kept] == 5).all() and (off.records["tokens"][off.records["iteration"] >= 5] == 3).all()
    # nothing is saved: every iteration drafts its two passes after the previous verdict
    assert (r["sent_s"] - r["draft_start_s"])[kept] == pytest.approx(2 * 0.004)
    # so the iteration is the same as without proactive drafting, up to the verify pass's context (it grows faster here)
    assert res.summary["iteration_s"] == pytest.approx(off.summary["iteration_s"], rel=1e-3)
    assert res.summary["iteration_s"] != pytest.approx(off.summary["iteration_s"] - 2 * 0.004, rel=1e-3)
    with pytest.raises(DesConfigError, match="proactive_shape"):
        DesConfig(**common, proactive_gain="tokens")
    with pytest.raises(DesConfigError, match="deepened"):
        DesConfig(**common, proactive_gain="tokens", proactive_shape=DraftShape.chain(2, 1.0), deepened=(deep1,))
    with pytest.raises(DesConfigError, match="proactive_gain"):
        DesConfig(**common, proactive_gain="both")
