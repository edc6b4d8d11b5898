"""The edge's worker pool and its gRPC link when the verification server goes away and comes back.

Found by a red-team of the edge's HTTP endpoint: after a server restart every idle client failed
its next request (its stream had died while idle); with the server gone each request held a client
for the whole connect timeout (30 s by default) although the port refused at once; and requests
still queued at shutdown were answered 502 ``verification_server_error`` instead of 503.
"""

from __future__ import annotations

import asyncio
import socket
import threading

import pytest

from runtime.edge_pool import EdgeJob, EdgePool
from runtime.split.edge_client import IterationLog, RequestOutcome
from runtime.split.transport import GrpcLink
from runtime.textstream import TextStream


class FakeLink:
    def __init__(self):
        self.dead, self.closed = False, False

    def close(self) -> None:
        self.closed = True


class FakeEdge:
    """An edge client whose requests end as ``script`` says: ``ok`` (one verdict, 3 tokens) or
    ``stream_failed`` (an error before the first verdict, the stream broken)."""

    def __init__(self, script: list[str]):
        self.link, self.broken, self.script = FakeLink(), False, script

    def generate(self, prompt, max_tokens, temperature, seed=0, request_id=None, on_tokens=None) -> RequestOutcome:
        what = self.script.pop(0)
        out = RequestOutcome(request_id or "r", len(prompt), [], "length", 0.0, 1.0)
        if what == "stream_failed":
            out.outcome, out.error, self.broken = "error", "the verification stream failed: UNAVAILABLE", True
        else:
            out.tokens = [1, 2, 3]
            out.iterations.append(IterationLog(out.request_id, 0, 2, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1, 0, 2, 3, False))
        return out


def _job(i: int, loop) -> EdgeJob:
    return EdgeJob(f"job{i}", [1, 2, 3], 8, 0.0, 0, TextStream(lambda ids: ""), loop)


def _run(pool: EdgePool, jobs: list[EdgeJob]) -> list[RequestOutcome]:
    for job in jobs:
        pool.submit(job)
        while job.outcome is None:  # finish() sets the outcome on the worker thread
            threading.Event().wait(0.01)
    return [job.outcome for job in jobs]


@pytest.fixture
def loop():
    lp = asyncio.new_event_loop()
    yield lp
    lp.close()


def test_an_idle_client_whose_stream_died_reconnects_before_its_next_job(loop):
    made: list[FakeEdge] = []

    def make_edge(i: int) -> FakeEdge:
        made.append(FakeEdge(["ok", "ok"]))
        return made[-1]

    pool = EdgePool(1, make_edge, queue_size=1)
    try:
        first = _run(pool, [_job(0, loop)])
        made[0].link.dead = True  # the server restarted while the client was idle
        second = _run(pool, [_job(1, loop)])
    finally:
        pool.close(5.0)
    assert [o.outcome for o in first + second] == ["length", "length"]
    assert len(made) == 2 and made[0].link.closed  # a new stream, the dead one closed; no request failed


def test_a_stream_that_fails_before_its_first_verdict_is_retried_once_on_a_new_stream(loop):
    made: list[FakeEdge] = []
    # job 0: fails on stream 1, retried on stream 2 (ok); job 1: fails on stream 2, retried on stream 3 (fails)
    scripts = [["stream_failed"], ["ok", "stream_failed"], ["stream_failed"]]

    def make_edge(i: int) -> FakeEdge:
        made.append(FakeEdge(scripts.pop(0)))
        return made[-1]

    pool = EdgePool(1, make_edge, queue_size=1)
    try:
        retried = _run(pool, [_job(0, loop)])
        failed_twice = _run(pool, [_job(1, loop)])
    finally:
        pool.close(5.0)
    assert retried[0].outcome == "length" and retried[0].tokens == [1, 2, 3]
    assert failed_twice[0].outcome == "error"  # one retry, not a loop: the second failure is the answer
    assert len(made) == 3 and not made[2].script and pool.counts == {"length": 1, "error": 1}


def test_health_says_when_the_verification_server_cannot_be_reached(loop):
    up = [False]

    def make_edge(i: int) -> FakeEdge:
        if not up[0]:
            raise ConnectionError("the verification server at 127.0.0.1:1 refused the connection")
        return FakeEdge(["ok"])

    pool = EdgePool(1, make_edge, queue_size=1)
    try:
        assert pool.health()["status"] == "ok"  # nothing tried yet
        assert _run(pool, [_job(0, loop)])[0].outcome == "error" and pool.health()["status"] == "server_unreachable"
        up[0] = True
        assert _run(pool, [_job(1, loop)])[0].outcome == "length" and pool.health()["status"] == "ok"
    finally:
        pool.close(5.0)


def test_jobs_still_queued_at_shutdown_end_with_shutdown_not_error(loop):
    release = threading.Event()

    class SlowEdge(FakeEdge):
        def generate(self, *args, **kwargs):
            release.wait(10)
            return super().generate(*args, **kwargs)

    pool = EdgePool(1, lambda i: SlowEdge(["ok"]), queue_size=2)
    running, queued = _job(0, loop), _job(1, loop)
    pool.submit(running)
    while pool.busy == 0:
        threading.Event().wait(0.01)
    pool.submit(queued)
    pool.refuse()
    release.set()
    pool.close(5.0)
    assert queued.outcome.outcome == "shutdown" and running.outcome.outcome == "length"
    from runtime.edge_http import FAILED

    assert FAILED["shutdown"] == (503, "shutting_down")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the with-block ends: connections are refused


def test_a_reconnection_to_a_refusing_server_fails_at_once_not_after_the_timeout():
    port = _closed_port()
    # with fail_fast the message says the connection was refused: a wait of the timeout (60 s)
    # would have said "within 60 s" instead (and taken a minute)
    with pytest.raises(ConnectionError, match="refused the connection"):
        GrpcLink(f"127.0.0.1:{port}", connect_timeout_s=60.0, fail_fast=True)
    # the first connection of a client still waits for a server that may be starting
    with pytest.raises(ConnectionError, match="within 0.5 s"):
        GrpcLink(f"127.0.0.1:{port}", connect_timeout_s=0.5)
