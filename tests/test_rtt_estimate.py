"""The round trip an edge user reports (runtime.split.rtt_estimate) and the simulator's reading of it."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from experiments.split_sim_vs_real_simulate import reported_rtt_s
from runtime.split.rtt_estimate import MAX_RTT_S, MeasuredRtt


def test_nothing_observed_reports_the_emulated_delay():
    est = MeasuredRtt()
    assert est.stack_s == 0.0 and est.observed == 0
    assert est.rtt_s(0.02) == 0.02


def test_the_excess_over_each_iterations_emulated_delay_is_averaged():
    est = MeasuredRtt()
    est.observe([12.0, 14.0], emulated_s=0.010)  # 2 and 4 ms of stack
    est.observe([33.0], emulated_s=0.030)  # 3 ms, under another delay
    assert est.stack_s == pytest.approx(0.003)
    assert est.rtt_s(0.005) == pytest.approx(0.008)


def test_the_window_keeps_the_latest_iterations():
    est = MeasuredRtt(window=2)
    est.observe([10.0, 1.0, 2.0], emulated_s=0.0)
    assert est.observed == 2 and est.stack_s == pytest.approx(0.0015)


def test_nan_and_negative_times_are_skipped_and_only_the_mean_is_clamped():
    est = MeasuredRtt()
    est.observe([math.nan, -1.0, 4.0], emulated_s=0.005)  # 4 ms under a 5 ms delay: -1 ms of stack
    assert est.observed == 1 and est.stack_s == 0.0
    est.observe([8.0], emulated_s=0.005)  # +3 ms: the mean of -1 and +3 is 1 ms (clamping each would give 1.5)
    assert est.stack_s == pytest.approx(0.001)


def test_the_estimate_is_unbiased_under_the_delay_lines_jitter():
    """DelayedLink draws U(0, jitter) each way, so a round trip's emulated delay averages rtt + jitter;
    with a constant 2 ms stack the estimate is 2 ms whatever the jitter (clamping each iteration's
    excess at 0 gave 2.2 to 4.4 ms at 5 to 20 ms of jitter: the red-team's finding)."""
    rng = np.random.default_rng(0)
    for jitter_s in (0.005, 0.01, 0.02):
        est = MeasuredRtt(window=20000)
        delays = 0.010 + rng.uniform(0, jitter_s, size=(20000, 2)).sum(axis=1)
        est.observe(1e3 * (delays + 0.002), emulated_s=0.010 + jitter_s)
        assert est.stack_s == pytest.approx(0.002, abs=2e-4), jitter_s


def test_the_report_never_exceeds_the_servers_bound():
    est = MeasuredRtt()
    est.observe([11_000.0], emulated_s=0.0)  # an 11 s stack (a stalled host): the server refuses rtt_s > 10 s
    assert est.rtt_s(0.02) == MAX_RTT_S
    from runtime.split_placement import PlaceMsg
    from runtime.split_placement_service import PlacementService

    class Server:  # what validate reads of the server
        class cfg:
            max_prompt_tokens, max_tokens_limit = 8, 8

        class batcher:
            class verifier:
                vocab_size = 10

    svc = PlacementService(Server())
    assert svc.validate(PlaceMsg(prompt=[1], max_tokens=1, deadline_s=1.0, rtt_s=est.rtt_s(0.02))) is None
    assert "rtt_s must lie in [0, 10]" in svc.validate(PlaceMsg(prompt=[1], max_tokens=1, deadline_s=1.0, rtt_s=10.5))


def test_a_bad_window_is_refused():
    with pytest.raises(ValueError, match="window"):
        MeasuredRtt(window=0)


@given(st.lists(st.floats(0, 1e4, allow_nan=False), min_size=1, max_size=100), st.floats(0, 5))
def test_the_estimate_is_the_clamped_mean_excess_and_the_report_is_capped(times_ms, emulated_s):
    est = MeasuredRtt(window=200)
    est.observe(times_ms, emulated_s)
    excess = [t / 1e3 - emulated_s for t in times_ms]
    assert est.stack_s == pytest.approx(max(0.0, float(np.mean(excess))), abs=1e-9)
    assert 0.0 <= est.stack_s <= max(0.0, max(excess)) + 1e-9
    assert est.rtt_s(emulated_s) == pytest.approx(min(emulated_s + est.stack_s, MAX_RTT_S))


def test_the_simulator_plans_with_the_reported_rtt_where_recorded():
    g = pd.DataFrame({"rtt_s": [0.01, 0.0, 0.02], "reported_rtt_s": [0.013, np.nan, np.nan]})
    assert reported_rtt_s(g).tolist() == [0.013, 0.0, 0.02]  # an HTTP user or an unrecorded edge: the emulated RTT
    assert reported_rtt_s(g.drop(columns="reported_rtt_s")).tolist() == [0.01, 0.0, 0.02]  # a run before stop 43
