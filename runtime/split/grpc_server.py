"""Server side: the gRPC service in front of a :class:`VerificationBatcher`.

One bidirectional stream per edge client; the stream *is* the client (the server names it), so
when the stream ends -- the edge closed it, crashed or vanished -- the client leaves the batcher
and its target state is freed. A message that does not parse or fails validation ends that
stream with INVALID_ARGUMENT; the server keeps serving everyone else. Requests arrive as raw
bytes and are parsed here, so garbage bytes are INVALID_ARGUMENT too, not an internal error.
"""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor

import grpc
from google.protobuf.message import DecodeError

from runtime.split.batcher import VerificationBatcher
from runtime.split.messages import SERVICE, VerdictMsg, VerifyMsg, msg_to_request, reply_to_msg
from runtime.split.verifier import InvalidRequest


class VerifierService:
    def __init__(self, batcher: VerificationBatcher, reply_timeout_s: float = 60.0):
        self.batcher, self.reply_timeout_s = batcher, reply_timeout_s
        self.streams_opened = 0

    def verify(self, request_iterator, context):
        client = uuid.uuid4().hex
        self.batcher.join(client)
        self.streams_opened += 1
        context.add_callback(lambda: self.batcher.leave(client))
        try:
            for raw in request_iterator:
                try:
                    msg = VerifyMsg.FromString(raw)
                except DecodeError as exc:
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"not a VerifyMsg: {exc}")
                if msg.release:
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


def start_server(batcher: VerificationBatcher, address: str = "127.0.0.1:0", max_clients: int = 64) -> tuple[grpc.Server, int, VerifierService]:
    """Start serving on ``address``; returns ``(server, bound port, service)``. Stop with ``server.stop(grace)``."""
    service = VerifierService(batcher)
    handler = grpc.method_handlers_generic_handler(SERVICE, {
        "Verify": grpc.stream_stream_rpc_method_handler(service.verify, request_deserializer=None, response_serializer=VerdictMsg.SerializeToString)})
    server = grpc.server(ThreadPoolExecutor(max_workers=max_clients + 4, thread_name_prefix="verify-stream"), maximum_concurrent_rpcs=max_clients)
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"could not bind {address}")
    server.start()
    return server, port, service
