"""The round trip an edge user reports (runtime.split.rtt_estimate) and the simulator's reading of it."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from experiments.split_sim_vs_real_simulate import reported_rtt_s
from runtime.split.rtt_estimate import MeasuredRtt


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


def test_nan_and_negative_times_are_skipped_and_a_faster_than_emulated_trip_counts_as_zero():
    est = MeasuredRtt()
    est.observe([math.nan, -1.0, 4.0], emulated_s=0.005)  # 4 ms under a 5 ms delay: no stack
    assert est.observed == 1 and est.stack_s == 0.0


def test_a_bad_window_is_refused():
    with pytest.raises(ValueError, match="window"):
        MeasuredRtt(window=0)


@given(st.lists(st.floats(0, 1e4, allow_nan=False), min_size=1, max_size=100), st.floats(0, 5))
def test_the_estimate_is_a_nonnegative_mean_bounded_by_the_worst_excess(times_ms, emulated_s):
    est = MeasuredRtt(window=200)
    est.observe(times_ms, emulated_s)
    excess = [max(0.0, t / 1e3 - emulated_s) for t in times_ms]
    assert 0.0 <= est.stack_s <= max(excess) + 1e-12
    assert est.stack_s == pytest.approx(float(np.mean(excess)), abs=1e-12)


def test_the_simulator_plans_with_the_reported_rtt_where_recorded():
    g = pd.DataFrame({"rtt_s": [0.01, 0.0, 0.02], "reported_rtt_s": [0.013, np.nan, np.nan]})
    assert reported_rtt_s(g).tolist() == [0.013, 0.0, 0.02]  # an HTTP user or an unrecorded edge: the emulated RTT
    assert reported_rtt_s(g.drop(columns="reported_rtt_s")).tolist() == [0.01, 0.0, 0.02]  # a run before stop 43
