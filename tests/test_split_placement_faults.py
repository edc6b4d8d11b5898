"""Faults on the placement stream of ``runtime.serve placement=split`` (:mod:`runtime.split_rounds`, :mod:`runtime.split_placement_service`,
:class:`runtime.split_placement.EdgeUser`): a frozen server, an edge that hangs up before its round
is planned, an edge that stays connected but silent, malformed messages. Every request still ends
with exactly one outcome within a bounded time, and no server state outlives it (loopback, the
cached tiny pair; servers started and stopped inside the tests)."""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import grpc
import httpx
import pytest
from live_server import running
from test_split_serve import split_tiny_profile

from envs.plan import ED
from runtime.split.messages import SERVICE as VERIFY_SERVICE
from runtime.split_placement import METHOD, SERVICE, EdgeUser, PlacementMsg, PlaceMsg

BOUND_S = 30.0  # generous: an outcome must come within this, however loaded the host


def until(check, what: str, timeout_s: float = BOUND_S) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"{what} within {timeout_s} s")


def edge_count(rounds, outcome: str | None = None) -> int:
    counts = rounds.kind_counts["edge"]
    return counts[outcome] if outcome else sum(counts.values())


@pytest.fixture(scope="module")
def server(pair, tmp_path_factory):
    """One split server for the module: edge_first (an edge user drafts), a 1 s round window (a request
    stays queued that long, so an edge can hang up before its round is planned)."""
    profile = split_tiny_profile(pair, tmp_path_factory.mktemp("split_faults"))
    with running(pair, profile, scheduler="edge_first", placement="split", window_s=1.0, split={"port": 0, "cohorts": 1, "window_ms": 2.0},
                 calibration_probe_s=0) as srv:
        until(lambda: srv.serve_app.rounds.split_port, "the split port did not open")
        yield srv


def place_stream(srv):
    """A raw placement stream: its outbox (PlaceMsg or raw bytes; None half-closes) and the call."""
    channel = grpc.insecure_channel(f"127.0.0.1:{srv.serve_app.rounds.split_port}")
    place = channel.stream_stream(METHOD, request_serializer=lambda m: m if isinstance(m, bytes) else m.SerializeToString(),
                                  response_deserializer=PlacementMsg.FromString)
    outbox: queue.Queue = queue.Queue()
    return outbox, place(iter(outbox.get, None), timeout=2 * BOUND_S), channel


def next_reply(call, timeout_s: float = BOUND_S):
    """The call's next reply, or the RpcError it ended with; fails if neither comes within ``timeout_s``."""
    got: list = []

    def read() -> None:
        try:
            got.append(next(call))
        except grpc.RpcError as err:
            got.append(err)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout_s)
    assert got, f"no reply and no end of the stream within {timeout_s} s"
    return got[0]


def still_serving(srv, pair) -> None:
    """The server goes on: an ordinary edge request is served, and leaves no ED state behind."""
    rounds = srv.serve_app.rounds
    user = EdgeUser(f"127.0.0.1:{rounds.split_port}", pair.draft, rtt_s=0.001, reply_timeout_s=BOUND_S)
    try:
        res = user.request(pair.tokenizer.encode("def f(x):"), 4, deadline_s=BOUND_S)
    finally:
        user.close()
    assert res.outcome == "served", res
    until(lambda: not rounds.edge_active, "ED state left behind")
    assert httpx.get(f"{srv.url}/health", timeout=10).json()["edge_active"] == 0


# ----------------------------------------------------------------------------- 1: a frozen server
@pytest.mark.parametrize("frozen", ["before the decision", "after the ED report"])
def test_a_frozen_server_ends_every_edge_request_within_a_timeout(pair, frozen):
    """A server that accepts the streams but never answers (SIGSTOP looks like this to the edge): the
    request ends with ``error`` (a timeout) within deadline + reply timeout, not never."""
    release = threading.Event()

    def place(request_iterator, context):
        next(request_iterator, None)
        if frozen == "after the ED report":
            yield PlacementMsg(kind="decision", mode="ed", depth=1)
        release.wait(2 * BOUND_S)  # frozen (ends by itself, or when the test is over)

    def verify(request_iterator, context):  # frozen too: the edge's ED generation times out
        release.wait(2 * BOUND_S)
        yield from ()

    fake = grpc.server(ThreadPoolExecutor(max_workers=8))
    fake.add_generic_rpc_handlers((
        grpc.method_handlers_generic_handler(SERVICE, {"Place": grpc.stream_stream_rpc_method_handler(place, None, PlacementMsg.SerializeToString)}),
        grpc.method_handlers_generic_handler(VERIFY_SERVICE, {"Verify": grpc.stream_stream_rpc_method_handler(verify, None, None)}),
    ))
    port = fake.add_insecure_port("127.0.0.1:0")
    fake.start()
    user = EdgeUser(f"127.0.0.1:{port}", pair.draft, reply_timeout_s=1.0, connect_timeout_s=10.0)
    results: list = []
    worker = threading.Thread(target=lambda: results.append(user.request(pair.tokenizer.encode("def f():"), 4, deadline_s=1.0)), daemon=True)
    try:
        worker.start()
        worker.join(BOUND_S)
        assert results, f"the edge request did not end within {BOUND_S} s ({frozen})"
    finally:
        release.set()
        user.close()
        fake.stop(0).wait(10)
    res = results[0]
    assert res.outcome == "error" and res.mode == "error" and res.reason.startswith("timeout"), res
    if frozen == "after the ED report":
        assert res.decided_at is not None and res.edge is not None and "ED report" in res.reason


# ----------------------------------------------------------------------------- 2: an edge that hangs up before its round
def test_an_edge_that_hangs_up_before_its_round_is_not_planned(server, pair):
    rounds = server.serve_app.rounds
    before = edge_count(rounds, "error")
    outbox, call, channel = place_stream(server)
    outbox.put(PlaceMsg(request_id="gone", prompt=pair.tokenizer.encode("def f():"), max_tokens=8, deadline_s=BOUND_S, rtt_s=0.001))
    until(lambda: rounds.pending, "the request was not queued", 10.0)
    call.cancel()  # well within the round's 1 s window
    channel.close()
    until(lambda: edge_count(rounds, "error") == before + 1, "the hung-up request did not end")
    assert not rounds.pending and not rounds.edge_active
    # a later request's round runs after the one the dead request would have had: nothing was planned for it
    still_serving(server, pair)
    assert edge_count(rounds, "error") == before + 1


def test_a_request_that_ended_while_its_round_was_planned_is_not_placed(server, pair):
    """The race behind the above: the edge hangs up while the planner runs (the request left the queue)."""
    from runtime.split_placement_service import EdgeRequest
    from runtime.textstream import TextStream

    rounds = server.serve_app.rounds
    req = EdgeRequest(id="edge-ended", prompt_ids=[1, 2], max_tokens=4, deadline_s=BOUND_S, text=TextStream(pair.tokenizer.decode), outcome="error")
    assert rounds.place_other(req, 0, SimpleNamespace(modes=[ED], ed_depth=[2]), rounds.loop)  # taken care of: not rejected again
    assert "edge-ended" not in rounds.edge_active and req.mode == "-"


# ----------------------------------------------------------------------------- 3: a silent edge
def test_a_silent_edge_ends_late_after_its_deadline_and_grace(server, pair):
    rounds = server.serve_app.rounds
    grace, rounds.report_grace_s = rounds.report_grace_s, 1.0
    before = edge_count(rounds, "late")
    outbox, call, channel = place_stream(server)
    try:
        outbox.put(PlaceMsg(request_id="silent", prompt=pair.tokenizer.encode("def f():"), max_tokens=8, deadline_s=3.0, rtt_s=0.001))
        decision = next_reply(call)
        assert decision.kind == "decision" and decision.mode == "ed", decision
        # the edge stays connected and says nothing: the server ends the request after deadline + grace
        result = next_reply(call)
        assert not isinstance(result, grpc.RpcError), result
        assert result.kind == "result" and result.outcome == "late" and "report_grace_s" in result.reason, result
        until(lambda: edge_count(rounds, "late") == before + 1, "the late outcome was not counted")
        assert not rounds.edge_active
    finally:
        rounds.report_grace_s = grace
        outbox.put(None)
        call.cancel()
        channel.close()


# ----------------------------------------------------------------------------- 4: malformed messages
@pytest.mark.parametrize("case", ["garbage request", "garbage report", "out-of-vocabulary report", "report over max_tokens"])
def test_malformed_placement_messages_are_invalid_argument(server, pair, case):
    rounds = server.serve_app.rounds
    before = dict(rounds.kind_counts["edge"])
    outbox, call, channel = place_stream(server)
    try:
        if case == "garbage request":
            outbox.put(b"\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01")
            words, ended = "PlaceMsg", False
        else:
            outbox.put(PlaceMsg(request_id=case, prompt=pair.tokenizer.encode("def f():"), max_tokens=8, deadline_s=BOUND_S, rtt_s=0.001))
            decision = next_reply(call)
            assert decision.kind == "decision" and decision.mode == "ed", decision
            vocab = rounds.batcher.verifier.vocab_size
            report, words = {"garbage report": (b"\x0a\xff\xfe", "PlaceMsg"),
                             "out-of-vocabulary report": (PlaceMsg(done=True, tokens=[1, vocab], outcome="length"), "tokens"),
                             "report over max_tokens": (PlaceMsg(done=True, tokens=[1] * 9, outcome="length"), "max_tokens")}[case]
            outbox.put(report)
            ended = True
        err = next_reply(call)
        assert isinstance(err, grpc.RpcError) and err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
        assert words in err.details()
        # the request (if one was made) ends with exactly one outcome, error; no state is left
        after = before | {"error": before["error"] + ended}
        until(lambda: dict(rounds.kind_counts["edge"]) == after, f"the outcomes were not {after}")
        assert not rounds.edge_active
    finally:
        outbox.put(None)
        channel.close()
    still_serving(server, pair)


# ----------------------------------------------------------- 5: a fault on the edge before its generation
def test_an_edge_fault_before_its_generation_ends_the_request_with_one_error(server, pair):
    """The edge's own client fails as the ED decision arrives (here: it cannot be built): the edge
    reports the failure, the request ends with exactly one ``error`` on both sides, nothing is left."""
    rounds = server.serve_app.rounds
    before = edge_count(rounds, "error")
    user = EdgeUser(f"127.0.0.1:{rounds.split_port}", pair.draft, rtt_s=0.001, reply_timeout_s=BOUND_S)

    def broken(depth: int, link_s: tuple[float, float]):
        raise RuntimeError(f"no draft device for depth {depth}")

    user._edge_client = broken
    try:
        res = user.request(pair.tokenizer.encode("def g(y):"), 4, deadline_s=BOUND_S)
    finally:
        user.close()
    assert res.outcome == "error" and "no draft device" in res.reason, res
    until(lambda: edge_count(rounds, "error") == before + 1, "one error outcome counted")
    until(lambda: not rounds.edge_active, "ED state left behind")
    still_serving(server, pair)


# ------------------------------------------------------ 6: an event loop too busy to take the request
def test_a_request_the_busy_event_loop_cannot_take_is_unavailable_and_ends_once(server, pair, monkeypatch):
    """The hand-off to the event loop is bounded (``SUBMIT_TIMEOUT_S``): past it the stream gets
    UNAVAILABLE (was UNKNOWN, from an unhandled TimeoutError), the request ends with exactly one
    outcome, ``error``, and it is never queued or planned once the loop is free again."""
    import runtime.split_placement_service as placement_service

    rounds = server.serve_app.rounds
    monkeypatch.setattr(placement_service, "SUBMIT_TIMEOUT_S", 0.3)
    before = dict(rounds.kind_counts["edge"])
    unblock = threading.Event()
    rounds.loop.call_soon_threadsafe(lambda: unblock.wait(BOUND_S))  # the loop stalls until the stream has its answer
    outbox, call, channel = place_stream(server)
    try:
        outbox.put(PlaceMsg(request_id="busy", prompt=pair.tokenizer.encode("def f():"), max_tokens=8, deadline_s=BOUND_S, rtt_s=0.001))
        err = next_reply(call)
        assert isinstance(err, grpc.RpcError) and err.code() == grpc.StatusCode.UNAVAILABLE, err
        assert "server busy" in err.details()
    finally:
        unblock.set()
        outbox.put(None)
        channel.close()
    after = before | {"error": before["error"] + 1}
    until(lambda: dict(rounds.kind_counts["edge"]) == after, f"the outcomes were not {after}")
    assert not rounds.pending and not rounds.edge_active
    still_serving(server, pair)
    assert dict(rounds.kind_counts["edge"])["error"] == after["error"]
