"""Red-team of the split runtime's verification server (issue #14 section 2): faults that broke it.

- a request future cancelled while queued (``Future.cancel``, or an asyncio task awaiting it via
  ``asyncio.wrap_future`` being cancelled) killed the batcher thread: every later request of every
  client hung; the client's ``leave`` then raised and its state was never freed;
- an edge that froze or was cut off (no TCP reset reaches the server) kept its stream, target KV
  and cohort membership for as long as the server ran;
- a release message that also carried a request was silently answered with nothing;
- the batcher's statistics kept one entry per batch for as long as the server ran;
- an edge pool client whose stream could not be opened for a reason other than ``ConnectionError``
  died, leaving its job without an outcome.

Loopback only; servers start inside the tests and stop by themselves; the tiny float64 models.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from test_split_runtime import tiny
from test_split_transport import wait_until

from runtime.engines import generate_ad
from runtime.split.batcher import VerificationBatcher
from runtime.split.grpc_server import start_server
from runtime.split.messages import METHOD, VerdictMsg, VerifyMsg
from runtime.split.transport import GrpcLink, LocalLink
from runtime.split.verifier import BatchVerifier, VerifyRequest

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


@pytest.fixture(scope="module")
def target():
    return tiny(2, 32, seed=0)


def expected_verdict(target, prompt: list[int], drafts: list[int]) -> tuple[int, int]:
    """(accepted, bonus) of greedy verification: the target's own next tokens."""
    ref = generate_ad(target, [prompt], len(drafts) + 1).tokens[0]
    n = next((k for k, d in enumerate(drafts) if d != ref[k]), len(drafts))
    return n, ref[n]


def test_a_request_cancelled_while_queued_does_not_stop_the_server(target):
    # a long window with two members: the first request waits in the queue for the second client
    batcher = VerificationBatcher(BatchVerifier(target, max_depth=8), cohorts=1, window_s=0.5)
    try:
        a, b = LocalLink(batcher), LocalLink(batcher)
        cancelled = a.submit(VerifyRequest("", (1,), (1, 2, 3), 3))
        assert cancelled.cancel()  # still queued: the caller gave up on it
        reply = b.submit(VerifyRequest("", (7, 7), (4, 5, 6), 3)).result(timeout=5)
        assert (reply.accepted, reply.bonus) == expected_verdict(target, [4, 5, 6], [7, 7])
        assert batcher._thread.is_alive()
        # the cancelled request was never verified: client a has no session, it may send again
        assert wait_until(lambda: set(batcher.verifier.sessions) == {b.client}, 2)
        again = a.submit(VerifyRequest("", (1,), (1, 2, 3), 3)).result(timeout=5)
        assert (again.accepted, again.bonus) == expected_verdict(target, [1, 2, 3], [1])
        a.close()
        b.close()
        assert wait_until(lambda: batcher.members == 0 and not batcher.verifier.sessions, 2)
    finally:
        batcher.stop()


def test_an_asyncio_caller_cancelling_its_wait_does_not_stop_the_server(target):
    batcher = VerificationBatcher(BatchVerifier(target, max_depth=8), cohorts=1, window_s=0.3)
    try:
        a, b = LocalLink(batcher), LocalLink(batcher)

        async def give_up():  # e.g. an HTTP handler whose client went away
            try:
                await asyncio.wait_for(asyncio.wrap_future(a.submit(VerifyRequest("", (2,), (9, 8), 2))), timeout=0.05)
            except TimeoutError:
                pass

        asyncio.run(give_up())  # wrap_future cancels the batcher's future with the task
        reply = b.submit(VerifyRequest("", (), (3, 3), 2)).result(timeout=5)
        assert (reply.accepted, reply.bonus) == expected_verdict(target, [3, 3], [])
    finally:
        batcher.stop()


def test_a_client_leaving_with_a_cancelled_request_is_freed(target):
    batcher = VerificationBatcher(BatchVerifier(target, max_depth=8), cohorts=1, window_s=1.0)
    try:
        a, b = LocalLink(batcher), LocalLink(batcher)
        a.submit(VerifyRequest("", (1,), (1, 2, 3), 3)).cancel()
        a.close()  # raised InvalidStateError half-way: a stayed a member and its release was lost
        assert batcher.members == 1
        reply = b.submit(VerifyRequest("", (), (5,), 1)).result(timeout=5)  # b alone: no window wait for a
        assert reply.batch_size == 1
    finally:
        batcher.stop()


FROZEN_EDGE = """
import sys, time, grpc
payload = bytes.fromhex(sys.argv[2])
def requests():
    yield payload
    time.sleep(600)
channel = grpc.insecure_channel(sys.argv[1])
call = channel.stream_stream(sys.argv[3], request_serializer=lambda b: b, response_deserializer=lambda b: b)(requests())
next(call)
print("verified", flush=True)
time.sleep(600)
"""


def test_a_frozen_edge_is_dropped_and_its_state_freed(target):
    batcher = VerificationBatcher(BatchVerifier(target, max_depth=8), cohorts=1, window_s=0.002)
    server, port, _ = start_server(batcher, "127.0.0.1:0", keepalive_s=0.5)
    addr = f"127.0.0.1:{port}"
    payload = VerifyMsg(prompt=[3, 4, 5], drafts=[1, 2], committed=3).SerializeToString().hex()
    edge = subprocess.Popen([sys.executable, "-c", FROZEN_EDGE, addr, payload, METHOD], cwd=ROOT, env=ENV, stdout=subprocess.PIPE, text=True)
    try:
        assert edge.stdout.readline().strip() == "verified"
        assert batcher.members == 1 and len(batcher.verifier.sessions) == 1
        edge.send_signal(signal.SIGSTOP)  # alive as far as TCP knows, but never answers again
        assert wait_until(lambda: batcher.members == 0 and not batcher.verifier.sessions, 6.0), "the frozen edge kept its server state"
        link = GrpcLink(addr)  # the server goes on serving
        reply = link.submit(VerifyRequest("", (5,), (1, 2, 3), 3)).result(timeout=10)
        assert (reply.accepted, reply.bonus) == expected_verdict(target, [1, 2, 3], [5])
        link.close()
    finally:
        edge.kill()
        edge.wait()
        server.stop(grace=0.5).wait(5)
        batcher.stop()


def test_a_release_that_also_carries_a_request_is_invalid_argument(target):
    batcher = VerificationBatcher(BatchVerifier(target, max_depth=8), cohorts=1, window_s=0.002)
    server, port, _ = start_server(batcher, "127.0.0.1:0")
    try:
        payloads = [VerifyMsg(prompt=[1, 2], drafts=[3], committed=2).SerializeToString(),
                    VerifyMsg(release=True, prompt=[4, 5], drafts=[6], committed=2).SerializeToString()]
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.stream_stream(METHOD, request_serializer=lambda b: b, response_deserializer=VerdictMsg.FromString)(iter(payloads), timeout=10)
            replies = []
            with pytest.raises(grpc.RpcError) as err:
                for r in call:
                    replies.append(r)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "release" in err.value.details()
        assert len(replies) == 1
        assert wait_until(lambda: batcher.members == 0 and not batcher.verifier.sessions, 5)
    finally:
        server.stop(grace=0.5).wait(5)
        batcher.stop()


def test_batch_statistics_do_not_grow_with_every_batch(target):
    batcher = VerificationBatcher(BatchVerifier(target, max_depth=8), cohorts=1, window_s=0.0, max_batch=4)
    try:
        link = LocalLink(batcher)
        committed = link.submit(VerifyRequest("", (), (1, 2), 2)).result(timeout=5).committed
        for _ in range(30):
            committed = link.submit(VerifyRequest("", (), (), committed)).result(timeout=5).committed
        link.close()
        sizes = batcher.stats.batch_sizes
        assert batcher.stats.batches == 31 and len(sizes) <= batcher.max_batch  # one entry per size, not per batch
        assert dict(sizes) == {1: 31}
    finally:
        batcher.stop()


def test_an_edge_pool_client_survives_an_unexpected_error_opening_its_stream():
    from test_edge_pool_faults import FakeEdge, _job

    from runtime.edge_pool import EdgePool

    calls = []

    def make_edge(i: int):
        calls.append(i)
        if len(calls) == 1:
            raise RuntimeError("can't start new thread")  # not a ConnectionError
        return FakeEdge(["ok"])

    loop = asyncio.new_event_loop()
    pool = EdgePool(1, make_edge, queue_size=1)
    try:
        jobs = [_job(0, loop), _job(1, loop)]
        for job in jobs:
            pool.submit(job)
            assert wait_until(lambda job=job: job.outcome is not None, 5.0), "the job never got an outcome"
        assert [j.outcome.outcome for j in jobs] == ["error", "length"]
        assert "can't start new thread" in jobs[0].outcome.error
    finally:
        pool.close(2.0)
        loop.close()
