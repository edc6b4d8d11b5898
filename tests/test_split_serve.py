"""``runtime.serve placement=split``: edge users over gRPC beside HTTP users, planned with a v1
scheduler; every request one outcome; greedy ED output equals greedy AD (loopback, the cached tiny
pair, started and stopped inside the test)."""

import threading
from pathlib import Path

import httpx
import numpy as np
import pytest
from live_server import ROOT, running, tiny_pair, tiny_profile

from runtime.serve_config import ServeConfig, SplitSettings


def split_tiny_profile(pair, folder: Path) -> Path:
    """The measured one-thread split profile with the tiny pair's dimensions (the server refuses others)."""
    return tiny_profile(pair, folder, base="split_cpu1_specsched-pair", name="split_tiny_test")


def record_planned_rtts(rounds) -> list[float]:
    """A list that fills with the edge users' round trips as ``rounds`` (a live SplitRoundServer) plans them."""
    planned: list[float] = []
    as_round = rounds.as_round

    def seeing(batch, now):
        rnd = as_round(batch, now)
        planned.extend(rnd.rtt_s[rnd.has_edge].tolist())
        return rnd

    rounds.as_round = seeing
    return planned


# ----------------------------------------------------------------------------- config, before anything is built
SPLIT = {"placement": "split", "scheduler": "balance_ed", "profile": "split_cpu1_specsched-pair"}


@pytest.mark.parametrize("change, words", [
    ({"scheduler": "balance"}, "'scheduler' must be one of ['balance_ed', 'edge_first', 'policy']"),
    ({"profile": "cpu1_specsched-pair"}, "edge and network sections"),
    ({"profile": "auto"}, "edge and network sections"),
    ({"scheduler": "policy", "policy_path": "policies/paper_k50"}, "trained on EdgeSchedule-v1"),
    ({"placement": "both"}, "'placement' must be local or split"),
    ({"split": {"cohorts": 0}}, "'split.cohorts' must be an integer in [1, 8]"),
    ({"split": {"window_ms": -1}}, "'split.window_ms'"),
    ({"split": {"port": 8011}, "port": 8011}, "'split.port' must differ"),
    ({"split": {"prt": 1}}, "split.['prt']"),
    ({"devices": ["cpu", "cpu"]}, "'devices' must be null"),
    ({"split": {"device_sharing": "fair"}}, "'split.device_sharing' must be one of ['turns', 'os'], got 'fair'"),
])
def test_split_config_is_refused_before_anything_is_built(change, words):
    with pytest.raises(ValueError) as err:
        ServeConfig(**{**SPLIT, **change}).validate()
    assert words in str(err.value)


def test_split_config_accepts_the_v1_schedulers():
    for extra in ({"scheduler": "balance_ed"}, {"scheduler": "edge_first"}, {"scheduler": "policy", "policy_path": "policies/split_k20"}):
        cfg = ServeConfig(**{**SPLIT, **extra, "split": {"port": 0, "cohorts": 1}}).validate()
        assert cfg.split == SplitSettings(port=0, cohorts=1)
    assert ServeConfig().validate().placement == "local"  # local stays the default; split.* is ignored there


# ----------------------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def pair():
    return tiny_pair()


@pytest.mark.parametrize("scheduler, sharing", [("edge_first", "turns"), ("balance_ed", "os"), ("policy", "turns")])
def test_edge_and_http_users_each_end_with_one_outcome(pair, tmp_path, scheduler, sharing):
    from runtime.engines import generate_ad
    from runtime.split_placement import EdgeUser

    tok = pair.tokenizer
    prompts = [tok.encode("def add(a, b):"), tok.encode("for i in range(")]
    n_new = 12
    policy = {"policy_path": str(ROOT / "policies" / "split_k20")} if scheduler == "policy" else {}
    with running(pair, split_tiny_profile(pair, tmp_path), scheduler=scheduler, placement="split", window_s=0.3, **policy,
                 split={"port": 0, "cohorts": 2, "window_ms": 2.0, "device_sharing": sharing}, calibration_probe_s=0) as srv:
        url, rounds = srv.url, srv.serve_app.rounds
        for _ in range(100):
            if rounds.split_port:
                break
            threading.Event().wait(0.05)
        address = f"127.0.0.1:{rounds.split_port}"
        edge_results, http_results = [None, None], [None] * 3

        def edge(i):
            user = EdgeUser(address, pair.draft, rtt_s=0.002, eos_id=None, seed=i)
            try:
                edge_results[i] = user.request(prompts[i], n_new, deadline_s=30.0, request_id="same")  # edges' names may collide
            finally:
                user.close()

        def http(i):
            body = {"prompt": "def f(x):", "max_tokens": 8, "deadline_s": 30} if i < 2 else {"prompt": "x", "max_tokens": 64, "deadline_s": 0.01}
            http_results[i] = httpx.post(f"{url}/v1/completions", json=body, timeout=120)

        threads = [threading.Thread(target=edge, args=(i,)) for i in range(2)] + [threading.Thread(target=http, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
        # an invalid placement request is refused, the server goes on
        bad = EdgeUser(address, pair.draft)
        refused = bad.request([], 4, deadline_s=5.0)
        bad.close()
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
        health = httpx.get(f"{url}/health", timeout=10).json()
        turns = rounds.device_turns

    assert refused.outcome == "error" and "INVALID_ARGUMENT" in refused.reason
    assert [r.status_code for r in http_results[:2]] == [200, 200]
    assert http_results[2].status_code == 429  # hopeless deadline: rejected with its outcome
    planned = scheduler != "policy"  # the shipped v1 policy was trained on another profile: it may reject
    for r in edge_results:
        assert r is not None and r.outcome in (("served",) if planned else ("served", "late", "rejected")), r
        assert r.mode == ("ed" if scheduler == "edge_first" else r.mode)
    ed = [r for r in edge_results if r.mode == "ed"]
    assert ed or scheduler != "edge_first"
    for i, r in enumerate(edge_results):  # greedy ED (and AD / SD) output equals greedy AD
        assert r.request_id == "same"
        if r.outcome in ("served", "late"):
            assert r.tokens == generate_ad(pair.target, [prompts[i]], n_new, pad_id=tok.pad_id).tokens[0]
    assert all(r.depth >= 1 and r.edge is not None and r.edge.iterations for r in ed)
    # one outcome per request, counted per kind, and the edge's view agrees with the server's
    by_kind = health["by_kind"]
    assert sum(by_kind["edge"].values()) == 2 and sum(by_kind["http"].values()) == 3
    for outcome in ("served", "late", "rejected", "error"):
        assert by_kind["edge"][outcome] == sum(r.outcome == outcome for r in edge_results)
        assert f'specsched_split_requests_total{{kind="edge",outcome="{outcome}"}} {by_kind["edge"][outcome]:.1f}' in metrics
    if planned:
        assert by_kind["edge"]["served"] == 2 and by_kind["http"]["served"] == 2 and by_kind["http"]["rejected"] == 1
    assert health["edge_active"] == 0
    # the verifier's passes and the engines' steps ran as turns on the one device (or as free threads)
    if sharing == "os":
        assert turns is None and rounds.batcher.turns is None
    else:
        assert turns is not None and rounds.batcher.turns is turns
        assert (turns.used_s["ed"] > 0) == bool(ed) and turns.used_s["engine"] > 0


def test_a_broken_edge_stream_ends_its_request_with_error(pair, tmp_path):
    """An ED edge that goes away before its report -- after it has joined the verifier and had one
    block verified: the request ends with ``error``, the batcher has no member left, the verifier
    holds no session, and the server goes on."""
    import queue

    import grpc

    from runtime.split.messages import METHOD as VERIFY_METHOD
    from runtime.split.messages import VerdictMsg, VerifyMsg
    from runtime.split_placement import METHOD, PlacementMsg, PlaceMsg

    def until(check, what: str, timeout_s: float = 10.0) -> None:
        for _ in range(int(timeout_s / 0.05)):
            if check():
                return
            threading.Event().wait(0.05)
        raise AssertionError(f"{what} within {timeout_s} s")

    tok = pair.tokenizer
    ids = tok.encode("def f():")
    with running(pair, split_tiny_profile(pair, tmp_path), scheduler="edge_first", placement="split", window_s=0.1,
                 split={"port": 0, "cohorts": 1}, calibration_probe_s=0) as srv:
        rounds = srv.serve_app.rounds
        batcher, verifier = rounds.batcher, rounds.batcher.verifier
        until(lambda: rounds.split_port, "the split port did not open")
        channel = grpc.insecure_channel(f"127.0.0.1:{rounds.split_port}")
        place = channel.stream_stream(METHOD, request_serializer=PlaceMsg.SerializeToString, response_deserializer=PlacementMsg.FromString)
        call = place(iter([PlaceMsg(request_id="gone", prompt=ids, max_tokens=8, deadline_s=30.0, rtt_s=0.001)]))
        first = next(call)
        assert first.kind == "decision" and first.mode == "ed"  # edge_first: the edge drafts
        # the edge joins the verifier and has its prompt verified: it is a member with a session
        outbox: queue.Queue = queue.Queue()
        verify = channel.stream_stream(VERIFY_METHOD, request_serializer=VerifyMsg.SerializeToString, response_deserializer=VerdictMsg.FromString)
        verdicts = verify(iter(outbox.get, None))
        outbox.put(VerifyMsg(seq=0, prompt=ids, drafts=[], committed=len(ids)))
        assert next(verdicts).committed == len(ids) + 1
        assert batcher.members == 1 and len(verifier.sessions) == 1
        verdicts.cancel()  # the edge goes away without its report
        call.cancel()
        channel.close()
        until(lambda: sum(rounds.kind_counts["edge"].values()) == 1, "the request did not end")
        counts = dict(rounds.kind_counts["edge"])
        until(lambda: batcher.members == 0, "the broken edge did not leave the batcher")
        until(lambda: not verifier.sessions, "the verifier did not free the broken edge's session")
        assert not rounds.edge_active
        again = httpx.post(f"{srv.url}/v1/completions", json={"prompt": "x", "max_tokens": 4, "deadline_s": 30}, timeout=60)
    assert sum(counts.values()) == 1 and counts["error"] == 1
    assert again.status_code == 200 and again.json()["specsched"]["outcome"] == "served"


def test_the_plan_sets_the_verifiers_and_the_engines_shares(pair, tmp_path):
    """split.device_sharing=turns: the verifier weighted by the ED shares of the rounds whose ED users
    are active (summed), the engines by the new plan's AD + SD share."""
    from types import SimpleNamespace

    from envs.plan import AD, ED, Plan
    from runtime.device_turns import MIN_SHARE
    from runtime.split_rounds import ED_PARTY, ENGINE_PARTY, SplitRoundServer

    cfg = ServeConfig(scheduler="edge_first", placement="split", port=0, profile=str(split_tiny_profile(pair, tmp_path)), split={"port": 0})
    rounds = SplitRoundServer(cfg, pair)

    def shares():
        return turns.share(ED_PARTY), turns.share(ENGINE_PARTY)

    try:
        turns = rounds.device_turns
        rounds.share_device(Plan(np.array([ED, AD]), gamma=2, z=0.2, ed_depth=np.array([3, 0]), ed_share=0.3), round_start=1.0)
        assert shares() == pytest.approx((0.3, 0.7))
        rounds.edge_active["a"] = SimpleNamespace(round_start=1.0)  # round 1's ED user still drafting
        rounds.share_device(Plan(np.array([AD]), gamma=2, z=1.0), round_start=2.0)
        assert shares() == pytest.approx((0.3, 1.0))  # its share kept; the new plan's engines at theirs
        rounds.share_device(Plan(np.array([ED]), gamma=2, z=0.0, ed_depth=np.array([2]), ed_share=0.02), round_start=3.0)
        assert turns.share(ED_PARTY) == pytest.approx(0.32)  # a few new ED users do not shrink the earlier ones' share
        rounds.edge_active.clear()
        rounds.share_device(Plan(np.array([ED, ED]), gamma=2, z=0.0, ed_depth=np.array([2, 2]), ed_share=1.0), round_start=4.0)
        rounds.edge_active["b"] = SimpleNamespace(round_start=4.0)
        rounds.share_device(Plan(np.array([AD]), gamma=2, z=1.0), round_start=5.0)
        assert shares() == pytest.approx((1.0, 1.0))  # an all-ED round against an AD round: half and half, not all to ED
        rounds.edge_active.clear()
        rounds.share_device(Plan(np.array([AD]), gamma=2, z=1.0), round_start=6.0)
        assert shares() == (MIN_SHARE, 1.0)
    finally:
        rounds.batcher.stop()
        rounds.pool.shutdown(wait=False)


def test_the_queue_counts_ed_as_a_way_to_serve_an_edge_user(pair, tmp_path):
    """The hopeless check before planning: an edge user's fastest service includes ED alone (v1 model)."""
    from runtime.live_request import LiveRequest
    from runtime.split_rounds import EdgeRequest, SplitRoundServer
    from runtime.textstream import TextStream

    cfg = ServeConfig(scheduler="edge_first", placement="split", port=0, profile=str(split_tiny_profile(pair, tmp_path)), split={"port": 0})
    rounds = SplitRoundServer(cfg, pair)
    try:
        common = dict(prompt_ids=[1] * 20, max_tokens=64, deadline_s=5.0, text=TextStream(pair.tokenizer.decode))
        http, edge = LiveRequest(id="h", **common), EdgeRequest(id="e", rtt_s=0.01, **common)
        assert np.isfinite(rounds.min_service_s(edge))
        assert rounds.min_service_s(edge) == min(rounds.min_service_s(http), edge.ed_alone_s)
        far = EdgeRequest(id="f", rtt_s=5.0, **common)  # a 5 s round trip per iteration: ED is no faster than AD / SD
        assert rounds.min_service_s(far) == rounds.min_service_s(http) < far.ed_alone_s
    finally:
        rounds.batcher.stop()
        rounds.pool.shutdown(wait=False)


def test_the_engines_split_their_turns_by_the_plans_ad_and_sd_shares():
    """Inside the engines' turns AD gets z and SD 1 - z - ed_share (not 1 - z: with an ED share, AD
    would get less than planned)."""
    from envs.plan import AD, ED, SD, Plan
    from runtime.round_runner import batch_shares

    plan = Plan(np.array([AD, SD, ED]), gamma=2, z=0.4, ed_depth=np.array([0, 0, 2]), ed_share=0.3)
    assert batch_shares(plan) == pytest.approx({"ad": 0.4, "sd": 0.3})
    assert batch_shares(Plan(np.array([AD, SD]), gamma=2, z=0.25)) == pytest.approx({"ad": 0.25, "sd": 0.75})  # v0 plans as before


def test_the_calibration_probe_takes_the_engines_turns(pair, tmp_path):
    """With turns the probe's steps wait for the verifier's turn and are timed without the wait."""
    from runtime.split_rounds import ED_PARTY, ENGINE_PARTY, SplitRoundServer

    cfg = ServeConfig(scheduler="edge_first", placement="split", port=0, profile=str(split_tiny_profile(pair, tmp_path)), split={"port": 0})
    rounds = SplitRoundServer(cfg, pair)
    turns = rounds.device_turns
    held, release = threading.Event(), threading.Event()

    def verifier_pass():
        with turns.turn(ED_PARTY):
            held.set()
            release.wait(30)

    try:
        v = threading.Thread(target=verifier_pass)
        v.start()
        assert held.wait(5)
        probe = threading.Thread(target=rounds.probe, kwargs={"learn": False})
        probe.start()
        probe.join(0.5)
        assert probe.is_alive() and ENGINE_PARTY in turns.waiting  # it waits for the device
        release.set()
        probe.join(60)
        v.join(5)
        assert not probe.is_alive() and turns.used_s[ENGINE_PARTY] > 0
    finally:
        release.set()
        rounds.batcher.stop()
        rounds.pool.shutdown(wait=False)


def test_the_edge_process_through_the_planner_probes_and_reports_its_round_trip(pair, tmp_path, capsys):
    """``runtime.edge --placement on`` end to end: each client probes its link, then its requests are
    planned by the live server (edge_first: ED) and each ends with one outcome; the round trip the
    server planned with is the emulated RTT plus the client's measured stack time (``--rtt-report
    measured``, the default), and ``--rtt-report link`` reports the emulated RTT alone."""
    import json

    from runtime.edge import main as edge_main

    with running(pair, split_tiny_profile(pair, tmp_path), scheduler="edge_first", placement="split", window_s=0.1,
                 split={"port": 0, "cohorts": 1, "window_ms": 2.0}, calibration_probe_s=0) as srv:
        rounds = srv.serve_app.rounds
        for _ in range(100):
            if rounds.split_port:
                break
            threading.Event().wait(0.05)
        planned = record_planned_rtts(rounds)
        for report in ("measured", "link"):
            out = tmp_path / f"edge_{report}.json"
            edge_main(["--pair", str(pair.path), "--server", f"127.0.0.1:{rounds.split_port}", "--placement", "on", "--depth", "plan",
                       "--clients", "1", "--requests", "2", "--max-new-tokens", "8", "--deadline-s", "30", "--rtt-ms", "2",
                       "--rtt-report", report, "--summary", str(out)])
            summary = json.loads(out.read_text())
            assert summary["requests"] == 2 and summary["outcomes"] == {"served": 2} and summary["modes"] == ["ed"], summary
    printed = capsys.readouterr().out
    assert printed.count("stack") == 1  # the probe ran for the measured client only
    measured, link = planned[:2], planned[2:]
    assert len(planned) == 4 and all(0.002 < rtt < 1.0 for rtt in measured) and link == [0.002, 0.002], planned
