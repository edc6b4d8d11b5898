"""Server side: the gRPC service in front of a :class:`VerificationBatcher`.

One bidirectional stream per edge client; the stream *is* the client (the server names it), so
when the stream ends -- the edge closed it, crashed or vanished -- the client leaves the batcher
and its target state is freed. A message that does not parse or fails validation ends that
stream with INVALID_ARGUMENT; the server keeps serving everyone else. Requests arrive as raw
bytes and are parsed here, so garbage bytes are INVALID_ARGUMENT too, not an internal error.

An edge that vanishes without closing its connection (frozen, suspended, cut off by the network:
no TCP reset reaches the server) is found by HTTP/2 keepalive pings: one that does not answer
within ``keepalive_s`` is dropped like a closed stream, so its state is freed too.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import grpc
from google.protobuf.message import DecodeError

from runtime.split.batcher import VerificationBatcher
from runtime.split.messages import SERVICE, VerdictMsg, VerifyMsg, msg_to_request, reply_to_msg
from runtime.split.verifier import InvalidRequest

if TYPE_CHECKING:
    from google.protobuf.message import Message


class VerifierService:
    def __init__(self, batcher: VerificationBatcher, reply_timeout_s: float = 60.0):
        self.batcher, self.reply_timeout_s = batcher, reply_timeout_s
        self.streams_opened = 0
        self._count_lock = threading.Lock()  # streams open on many gRPC threads at once: += alone can lose a count

    def verify(self, request_iterator: Iterator[Message], context: grpc.ServicerContext) -> Iterator[Message]:
        client = uuid.uuid4().hex
        self.batcher.join(client)
        with self._count_lock:
            self.streams_opened += 1
        context.add_callback(lambda: self.batcher.leave(client))
        try:
            for raw in request_iterator:
                try:
                    msg = VerifyMsg.FromString(raw)
                except DecodeError as exc:
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"not a VerifyMsg: {exc}")
                if msg.release:
                    if msg.prompt or msg.drafts:
                        # a release gets no verdict: one that also carries a request would leave the
                        # edge waiting for an answer that never comes (or matching the next one to it)
                        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a release carries no prompt or drafts (send the request on its own)")
                    self.batcher.release(client)
                    continue
                try:
                    reply = self.batcher.submit(msg_to_request(msg, client)).result(timeout=self.reply_timeout_s)
                except InvalidRequest as exc:
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
                except Exception as exc:  # noqa: BLE001 - this stream fails; the server goes on
                    context.abort(grpc.StatusCode.UNAVAILABLE, f"{type(exc).__name__}: {exc}")
                yield reply_to_msg(reply, msg.seq)
        finally:
            self.batcher.leave(client)


KEEPALIVE_S = 20.0  #: seconds between keepalive pings, and to answer one, before a silent edge is dropped


def keepalive_options(keepalive_s: float) -> list[tuple[str, int]]:
    """Server options that ping every connection every ``keepalive_s`` (idle or not) and drop one
    that does not answer a ping within ``keepalive_s``. Why: without them a frozen or cut-off edge
    kept its stream -- its target KV, its cohort membership (every batch of its cohort waited the
    window for it) and a ``max_clients`` slot -- for as long as the server ran. ``ping_timeout_ms``
    is the setting that drops the peer (``keepalive_timeout_ms`` alone did not, gRPC 1.85); without
    ``max_pings_without_data`` 0 pings stop on a stream that sends nothing."""
    ms = max(1, int(1e3 * keepalive_s))
    return [("grpc.keepalive_time_ms", ms), ("grpc.keepalive_timeout_ms", ms), ("grpc.http2.ping_timeout_ms", ms),
            ("grpc.http2.max_pings_without_data", 0), ("grpc.keepalive_permit_without_calls", 1)]


def start_server(batcher: VerificationBatcher, address: str = "127.0.0.1:0", max_clients: int = 64,
                 keepalive_s: float = KEEPALIVE_S) -> tuple[grpc.Server, int, VerifierService]:
    """Start serving on ``address``; returns ``(server, bound port, service)``. Stop with ``server.stop(grace)``."""
    if not keepalive_s > 0:
        raise ValueError(f"keepalive_s must be > 0, got {keepalive_s}")
    service = VerifierService(batcher)
    handler = grpc.method_handlers_generic_handler(SERVICE, {
        "Verify": grpc.stream_stream_rpc_method_handler(service.verify, request_deserializer=None, response_serializer=VerdictMsg.SerializeToString)})
    server = grpc.server(ThreadPoolExecutor(max_workers=max_clients + 4, thread_name_prefix="verify-stream"), maximum_concurrent_rpcs=max_clients,
                         options=keepalive_options(keepalive_s))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"could not bind {address}")
    server.start()
    return server, port, service
