"""runtime.split_loadgen against a live loopback ``runtime.serve placement=split`` (the cached tiny
pair, scheduler edge_first so edge users run ED): its CLI (``main``) for two rounds of edge and HTTP users, then one round of hopeless deadlines
through ``run_round``. Every request ends with exactly one outcome, and the server's per-kind
counters add up to what the load generator saw. The edge users report the measured round trip
(``--rtt-report measured``, the default: probed first), and the server plans with what they report."""

from __future__ import annotations

import threading
from collections import Counter

import httpx
import numpy as np
import pandas as pd
import pytest
from live_server import running, tiny_pair
from test_split_serve import record_planned_rtts, split_tiny_profile

from runtime.live_request import OUTCOMES
from runtime.split_loadgen import draw_round, main, probe_links, run_round


@pytest.fixture(scope="module")
def pair():
    return tiny_pair()


def _split_port(rounds) -> int:
    for _ in range(200):
        if rounds.split_port:
            return rounds.split_port
        threading.Event().wait(0.05)
    raise AssertionError("the split port did not open within 10 s")


def test_the_load_generator_against_a_live_split_server(pair, tmp_path):
    from runtime.split_placement import EdgeUser

    out = tmp_path / "load.csv"
    tok = pair.tokenizer
    with running(pair, split_tiny_profile(pair, tmp_path), scheduler="edge_first", placement="split", window_s=0.2,
                 split={"port": 0, "cohorts": 2, "window_ms": 2.0}, calibration_probe_s=0) as srv:
        url, rounds = srv.url, srv.serve_app.rounds
        address = f"127.0.0.1:{_split_port(rounds)}"
        planned_rtts = record_planned_rtts(rounds)  # the edge users' round trips as the server's rounds saw them
        # the probe alone: it measures a stack time, counts nothing, and closes its stream (no batcher member
        # left behind); a probe that fails (an unreachable prompt: none) reports NaN and the caller goes on
        probed = EdgeUser(address, pair.draft, eos_id=tok.eos_id, seed=5)
        try:
            assert probe_links([probed], tok, ["def f(x):"], 0.003)[0] > 0
            assert probed.reported_rtt_s > 0.003 and probed.measured_rtt.observed >= 1
            for _ in range(100):
                if rounds.batcher.members == 0:
                    break
                threading.Event().wait(0.05)
            assert rounds.batcher.members == 0 and sum(rounds.kind_counts["edge"].values()) == 0
            assert np.isnan(probe_links([probed], tok, [""], 0.003)[0])  # an empty prompt: the probe fails, NaN
        finally:
            probed.close()
        main(["--pair", str(pair.path), "--url", url, "--split", address, "--edge-users", "2", "--http-users", "2", "--rounds", "2",
              "--tokens", "4", "12", "--deadline-s", "20", "30", "--rtt-ms", "1", "5", "--seed", "3", "--out", str(out)])
        # a round nobody can make: 10 ms deadlines for 64 tokens
        hopeless = draw_round(np.random.default_rng(0), 9, 1, 1, (64, 64), (0.01, 0.01), (1.0, 1.0), ["def f(x):"], setting="hopeless")
        edges = [EdgeUser(address, pair.draft, eos_id=tok.eos_id, seed=9, rtt_report="link")]
        try:
            run_round(hopeless, edges, url, tok)
        finally:
            edges[0].close()
        health = httpx.get(f"{url}/health", timeout=10).json()
        metrics = httpx.get(f"{url}/metrics", timeout=10).text

    rows = pd.read_csv(out)
    assert len(rows) == 2 * 4 and sorted(Counter(rows["kind"]).items()) == [("edge", 4), ("http", 4)]
    assert set(rows["outcome"]) <= set(OUTCOMES) and rows["outcome"].notna().all()
    assert (rows["outcome"] == "served").all(), rows[["kind", "mode", "outcome", "reason"]]  # generous deadlines
    edge, http = rows[rows["kind"] == "edge"], rows[rows["kind"] == "http"]
    assert (edge["mode"] == "ed").all() and (edge["iterations"] >= 1).all() and (edge["depth"] >= 1).all()  # edge_first: ED
    assert set(http["mode"]) <= {"ad", "sd"}
    assert (rows["tokens"] >= 1).all()
    assert all(u["outcome"] == "rejected" for u in hopeless), hopeless

    # one outcome per request: the server counted each request once, under the kind and outcome the generator saw
    seen = {kind: Counter() for kind in ("edge", "http")}
    for kind, outcome in [*zip(rows["kind"], rows["outcome"], strict=True), *((u["kind"], u["outcome"]) for u in hopeless)]:
        seen[kind][outcome] += 1
    by_kind = health["by_kind"]
    for kind in ("edge", "http"):
        assert sum(by_kind[kind].values()) == sum(seen[kind].values()) == 5
        for outcome in OUTCOMES:
            assert by_kind[kind][outcome] == seen[kind][outcome], (kind, outcome, by_kind, seen)
            assert f'specsched_split_requests_total{{kind="{kind}",outcome="{outcome}"}} {seen[kind][outcome]:.1f}' in metrics
    for outcome in OUTCOMES:  # the server-wide counter is the sum over kinds
        assert f'specsched_requests_total{{outcome="{outcome}"}} {seen["edge"][outcome] + seen["http"][outcome]:.1f}' in metrics
    assert health["edge_active"] == 0

    # the reported round trip: the emulated RTT plus a positive stack time (the probe ran first, so even
    # round 0's users have one), and exactly what the server planned with; "link" reports the RTT alone
    assert (edge["reported_rtt_s"] > edge["rtt_s"]).all() and (edge["reported_rtt_s"] < edge["rtt_s"] + 1.0).all(), edge[["rtt_s", "reported_rtt_s"]]
    assert hopeless[0]["reported_rtt_s"] == hopeless[0]["rtt_s"] == 0.001
    assert sorted(planned_rtts) == pytest.approx(sorted(edge["reported_rtt_s"]))  # the hopeless one is refused before any round
