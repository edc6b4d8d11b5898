"""A lean HTTP/1.1 POST over asyncio streams, for the load generator.

Why not httpx: under a burst the load generator is part of what it measures. Each request's clock
starts when it is meant to be sent, so the client's own CPU time per request delays every request
behind it and counts against the server. With httpx (one ``AsyncClient``, unbounded pool) the load
generator spent ~1.4 ms of CPU per streamed request at 100 concurrent requests and ~2.2 ms at 640
(process CPU time over a burst of requests the server rejects at once, on a shared 2-CPU host);
this client, ~0.3 ms. It opens one connection per request (``Connection: close``), writes the
request in one call and parses only what the server sends: a status line, headers, then a body
with ``Content-Length``, chunked, or up to the close.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from urllib.parse import urlsplit


class HTTPError(RuntimeError):
    """The response could not be read as HTTP/1.1."""


class Response:
    def __init__(self, status: int, headers: dict[str, str], reader: asyncio.StreamReader):
        self.status, self.headers, self._reader = status, headers, reader

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives (de-chunked)."""
        r = self._reader
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                line = await r.readline()
                if not line:
                    raise HTTPError("connection closed inside a chunked body")
                try:
                    size = int(line.split(b";", 1)[0].strip(), 16)
                except ValueError:
                    raise HTTPError(f"bad chunk size line {line[:40]!r}") from None
                if size == 0:
                    while (await r.readline()).strip():  # trailers, then the blank line
                        pass
                    return
                data = await r.readexactly(size)
                await r.readexactly(2)  # CRLF after the chunk
                yield data
        elif "content-length" in self.headers:
            n = int(self.headers["content-length"])
            if n:
                yield await r.readexactly(n)
        else:  # until the server closes
            while data := await r.read(65536):
                yield data

    async def read(self) -> bytes:
        return b"".join([c async for c in self.chunks()])

    async def lines(self) -> AsyncIterator[str]:
        """The body's lines (UTF-8), as soon as each is complete."""
        buf = b""
        async for chunk in self.chunks():
            buf += chunk
            *complete, buf = buf.split(b"\n")
            for line in complete:
                yield line.rstrip(b"\r").decode("utf-8")
        if buf:
            yield buf.decode("utf-8")


def url_problem(url: object) -> str | None:
    """What keeps this client from sending to ``url`` (None: nothing). It speaks plain HTTP to
    ``http://HOST[:PORT][/PATH]`` only (port 1..65535, 80 when left out): no TLS, and it sends
    no credentials, query or fragment, so an address with any of those would fail or silently
    reach something else on every request -- callers refuse it up front instead."""
    if not isinstance(url, str):
        return "not a string"
    parts = urlsplit(url)
    if parts.scheme != "http":
        return f"scheme {parts.scheme!r} is not supported (plain http only)" if parts.scheme else "no http:// scheme"
    if not parts.hostname:
        return "no host"
    try:
        port = parts.port  # ValueError when not a number or outside 0..65535
    except ValueError:
        return "the port is not a number in 1..65535"
    if port == 0:
        return "port 0 cannot be connected to"
    if parts.username is not None or parts.password is not None or parts.query or parts.fragment:
        return "credentials, a query or a fragment would not be sent"
    return None


class post_json:
    """``async with post_json(url, path, payload) as response:`` one POST on its own connection
    (``headers``: extra request headers, e.g. the send stamp ``X-Request-Start``)."""

    def __init__(self, url: str, path: str, payload: dict, headers: dict[str, str] | None = None):
        problem = url_problem(url)
        if problem:
            raise ValueError(f"only http://HOST[:PORT] URLs (port 1..65535) are supported: {problem}, got {url!r}")
        parts = urlsplit(url)
        self.host, self.port = parts.hostname, parts.port or 80
        self.path = (parts.path.rstrip("/") + path) or "/"
        self.body = json.dumps(payload).encode()
        self.extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self.writer: asyncio.StreamWriter | None = None

    async def __aenter__(self) -> Response:
        reader, self.writer = await asyncio.open_connection(self.host, self.port)
        try:
            return await self._send_and_read_head(reader)
        except BaseException:  # a bad answer, or cancelled while waiting for one: __aexit__ will not run, so close here
            self.writer.close()
            raise

    async def _send_and_read_head(self, reader: asyncio.StreamReader) -> Response:
        host = f"[{self.host}]" if ":" in self.host else self.host  # an IPv6 literal is bracketed in Host (RFC 9110 7.2)
        head = (f"POST {self.path} HTTP/1.1\r\nHost: {host}:{self.port}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(self.body)}\r\nConnection: close\r\n{self.extra}\r\n").encode("latin-1")
        self.writer.write(head + self.body)
        status_line = await reader.readline()
        fields = status_line.split(None, 2)
        if len(fields) < 2 or not fields[0].startswith(b"HTTP/1.") or not fields[1].isdigit():
            raise HTTPError(f"bad status line {status_line[:60]!r}")
        headers: dict[str, str] = {}
        while True:
            line = await reader.readline()
            if not line:
                raise HTTPError("connection closed inside the headers")
            if not line.strip():
                break
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        return Response(int(fields[1]), headers, reader)

    async def __aexit__(self, *exc) -> None:
        if self.writer is not None:
            self.writer.close()
