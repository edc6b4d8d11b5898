"""Closing HTTP connections whose request headers do not arrive in time (slow or silent clients).

uvicorn times out only idle keep-alive connections: a client that opens a connection and sends
nothing, or half its headers, holds it (and a file descriptor) forever. Both HTTP entry points --
the live server (:mod:`runtime.serve`) and the edge's local endpoint (:mod:`runtime.edge_http`) --
run uvicorn with :func:`header_timeout_protocol`, so such a connection is closed after
``timeout_s``. Its own module because both servers use it and neither should import the other.
"""

from __future__ import annotations

import asyncio
import json
import socket

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from runtime.openai_schemas import error_body

HEADER_GRACE = 6  #: header_timeout_s periods a connection with unread bytes waiting may get (the loop is behind, not the client)


def unread_bytes_waiting(transport: asyncio.Transport) -> bool:
    """Whether the kernel holds bytes of this connection that the event loop has not read yet."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return False
    try:
        with socket.fromfd(sock.fileno(), sock.family, sock.type) as dup:  # a duplicate: peeking leaves the data for the loop
            return bool(dup.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except OSError:  # nothing waiting (EAGAIN), or the connection is gone
        return False


def header_timeout_protocol(timeout_s: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol, closing a connection whose request headers are not complete in time
    (uvicorn itself only times out idle keep-alive connections).

    A connection whose bytes have arrived but wait unread behind a busy event loop (a burst of
    thousands of requests) is not a slow client: it gets another period, at most ``HEADER_GRACE``
    times, instead of being reset with its request unread.

    Every request on a kept-alive connection is timed, not only the first: after a response, the
    first byte that arrives starts the clock for the next request's headers (uvicorn cancels its
    keep-alive timer on any byte, so a client sending half a second request, or trickling the body
    of a GET the app answered without reading it, would otherwise hold the connection for good).
    An idle kept-alive connection is left to uvicorn's keep-alive timeout."""

    class HeaderTimeoutH11(H11Protocol):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._armed_cycle = None  # the request cycle when the clock started: a different one means a request began
            self._await_next = False  # a response is complete: the next byte starts the clock
            self._arm()

        def _arm(self) -> None:
            self._header_periods = 1
            self._header_timer = asyncio.get_running_loop().call_later(timeout_s, self._headers_late)

        def _headers_late(self) -> None:
            if self.cycle is not self._armed_cycle:  # a request has started since the clock started
                return
            if self._header_periods < HEADER_GRACE and unread_bytes_waiting(self.transport):
                self._header_periods += 1
                self._header_timer = asyncio.get_running_loop().call_later(timeout_s, self._headers_late)
                return
            self.transport.close()

        def data_received(self, data: bytes) -> None:
            if self._await_next:  # the first byte after a response: the next request's headers are due
                self._await_next = False
                self._header_timer.cancel()
                self._armed_cycle = self.cycle
                self._arm()
            super().data_received(data)

        def handle_events(self) -> None:
            super().handle_events()
            if self.cycle is not self._armed_cycle:
                self._header_timer.cancel()
                self._await_next = False

        def on_response_complete(self) -> None:
            self._header_timer.cancel()
            self._armed_cycle = self.cycle
            self._await_next = True
            super().on_response_complete()  # may start a pipelined request at once (handle_events)

        def connection_lost(self, exc) -> None:
            self._header_timer.cancel()
            super().connection_lost(exc)

        def send_400_response(self, msg: str) -> None:
            """A request h11 cannot parse (a garbage request line, a negative or repeated
            Content-Length): the OpenAI-shaped JSON error every other refusal has, not uvicorn's
            plain text. It never reaches the app, so the app's per-status counters do not see it."""
            body = json.dumps(error_body(400, f"malformed HTTP request: {msg}", code="invalid_http")).encode()
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), (b"connection", b"close")]
            for event in (h11.Response(status_code=400, headers=headers, reason=b"Bad Request"), h11.Data(data=body), h11.EndOfMessage()):
                self.transport.write(self.conn.send(event))
            self.transport.close()

    return HeaderTimeoutH11
