"""The live server's OpenAI-compatible surface, driven by the unmodified ``openai`` client and raw HTTP
(loopback, ephemeral port, started and stopped inside the module)."""

import asyncio
import json
import socket
import time

import httpx
import pytest
from live_server import running


@pytest.fixture(scope="module")
def server(pair, profile):
    with running(pair, profile, max_body_bytes=4096, body_timeout_s=0.5, header_timeout_s=0.5) as srv:
        yield srv.url


def _client(url):
    from openai import OpenAI

    return OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)


def test_completion_served(server):
    r = httpx.post(f"{server}/v1/completions", json={"prompt": "def f(x):", "max_tokens": 8, "deadline_s": 20}, timeout=60)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["specsched"]["outcome"] == "served" and body["specsched"]["mode"] in ("ad", "sd")
    assert body["usage"] == {"prompt_tokens": 9, "completion_tokens": 8, "total_tokens": 17}
    assert body["choices"][0]["finish_reason"] == "length"


def test_openai_client_completions_sync_streaming_and_not(server):
    client = _client(server)
    plain = client.completions.create(model="specsched", prompt="import os", max_tokens=12, extra_body={"deadline_s": 20})
    assert plain.usage.completion_tokens == 12 and plain.choices[0].finish_reason == "length"
    chunks = list(client.completions.create(model="specsched", prompt="import os", max_tokens=12, stream=True,
                                            stream_options={"include_usage": True}, extra_body={"deadline_s": 20}))
    streamed = "".join(c.choices[0].text for c in chunks if c.choices)
    assert streamed == plain.choices[0].text  # greedy: the same text, streamed or not
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 12 and chunks[-1].choices == []


def test_openai_client_chat_sync(server):
    client = _client(server)
    msgs = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "def add(a, b):"}]
    plain = client.chat.completions.create(model="specsched", messages=msgs, max_tokens=10)
    assert plain.choices[0].message.role == "assistant" and plain.usage.completion_tokens == 10
    stream = client.chat.completions.create(model="specsched", messages=msgs, max_tokens=10, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == plain.choices[0].message.content


def test_openai_client_async_and_models(server):
    from openai import AsyncOpenAI

    async def go():
        client = AsyncOpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=60)
        models = await client.models.list()
        plain, stream = await asyncio.gather(
            client.completions.create(model="specsched", prompt="class A:", max_tokens=8),
            client.chat.completions.create(model="specsched", messages=[{"role": "user", "content": "hi"}], max_tokens=8, stream=True))
        pieces = [c async for c in stream]
        return models, plain, pieces

    models, plain, pieces = asyncio.run(go())
    assert [m.id for m in models.data] == ["specsched"]
    assert plain.usage.completion_tokens == 8
    assert pieces[-1].choices[0].finish_reason == "length"


def test_per_request_sampling_through_the_openai_client(pair, profile):
    """Requests with their own temperature / top_p / seed in one batch: a seeded request gives the
    same text alone and beside others, greedy requests are unchanged by sampled neighbours, a
    sampled request samples (another seed, another text). SD only: one seed is reproducible within
    a mode and draft depth."""
    from openai import AsyncOpenAI

    prompt, n = "def parse(line):", 24

    async def go(url):
        client = AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)

        async def ask(**kw):
            r = await client.completions.create(model="specsched", prompt=prompt, max_tokens=n, extra_body={"deadline_s": 60}, **kw)
            assert r.model_extra["specsched"]["outcome"] == "served" and r.model_extra["specsched"]["mode"] == "sd"
            return r.choices[0].text

        greedy_alone = await ask()
        seeded_alone = await ask(temperature=1.0, top_p=0.9, seed=1234)
        batch = await asyncio.gather(ask(), ask(temperature=1.0, top_p=0.9, seed=1234), ask(temperature=1.5, seed=99),
                                     ask(temperature=0.3, top_p=0.5, seed=7), ask(temperature=1.0, top_p=0.9, seed=4321))
        return greedy_alone, seeded_alone, batch

    with running(pair, profile, scheduler="sd_only") as srv:
        greedy_alone, seeded_alone, (greedy, seeded, hot, cool, other_seed) = asyncio.run(go(srv.url))
    assert greedy == greedy_alone
    assert seeded == seeded_alone
    assert other_seed != seeded and hot != greedy


def test_stop_sequence_ends_with_stop(server):
    ref = httpx.post(f"{server}/v1/completions", json={"prompt": "def f(x):", "max_tokens": 24}, timeout=60).json()["choices"][0]["text"]
    stop = ref[3:5]
    assert stop and stop in ref
    want = ref[: ref.index(stop)]
    plain = httpx.post(f"{server}/v1/completions", json={"prompt": "def f(x):", "max_tokens": 24, "stop": [stop]}, timeout=60).json()
    assert plain["choices"][0]["text"] == want and plain["choices"][0]["finish_reason"] == "stop"
    chunks = list(_client(server).completions.create(model="specsched", prompt="def f(x):", max_tokens=24, stop=stop, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == want
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_rejected_request_gets_429_with_outcome(server):
    r = httpx.post(f"{server}/v1/completions", json={"prompt": "def g():", "max_tokens": 64, "deadline_s": 0.01}, timeout=60)
    assert r.status_code == 429
    body = r.json()
    assert body["error"]["type"] == "rate_limit_error" and body["error"]["code"] == "rejected"
    assert body["specsched"]["outcome"] == "rejected" and body["specsched"]["reason"].startswith("deadline")
    # streamed: the outcome is in the final chunk
    r = httpx.post(f"{server}/v1/completions", json={"prompt": "def g():", "max_tokens": 64, "deadline_s": 0.01, "stream": True}, timeout=60)
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    assert events[-1]["specsched"]["outcome"] == "rejected" and events[-1]["choices"][0]["finish_reason"] == "rejected"


def _nested(depth: int) -> bytes:
    return b'{"prompt": "x", "max_tokens": 2, "user": ' + b"[" * depth + b"]" * depth + b"}"


@pytest.mark.parametrize(
    "payload,status,param,words",
    [
        (b"{not json", 400, None, "JSON"),
        (b"[1, 2]", 400, None, "object"),
        (json.dumps({"max_tokens": 4}).encode(), 400, "prompt", "required"),
        (json.dumps({"prompt": "x", "max_tokens": 10_000}).encode(), 400, "max_tokens", "max_tokens"),
        (json.dumps({"prompt": "x", "max_tokens": 4, "deadline_s": -1}).encode(), 400, "deadline_s", "greater than 0"),
        (json.dumps({"prompt": "x" * 300, "max_tokens": 4}).encode(), 400, "prompt", "limit"),
        (b'{"prompt": "\\ud800", "max_tokens": 2}', 400, None, ""),  # a lone surrogate
        (b'{"prompt": "x", "max_tokens": ' + b"9" * 400 + b"}", 400, "max_tokens", "max_tokens"),
        (b'{"prompt": "x", "deadline_s": ' + b"9" * 400 + b"}", 400, "deadline_s", "finite"),
        (_nested(2000), 400, None, ""),
        (json.dumps({"prompt": "x", "n": 2}).encode(), 400, "n", "not supported"),
        (json.dumps({"prompt": "x", "logprobs": 3}).encode(), 400, "logprobs", "not supported"),
        (json.dumps({"prompt": "x", "echo": True}).encode(), 400, "echo", "not supported"),
        (json.dumps({"prompt": "x", "temperature": 2.5}).encode(), 400, "temperature", "less than or equal to 2"),
        (json.dumps({"prompt": "x", "temperature": -0.1}).encode(), 400, "temperature", "greater than or equal to 0"),
        (json.dumps({"prompt": "x", "top_p": 0}).encode(), 400, "top_p", "greater than 0"),
        (json.dumps({"prompt": "x", "top_p": 1.01}).encode(), 400, "top_p", "less than or equal to 1"),
        (json.dumps({"prompt": "x", "seed": 2**64}).encode(), 400, "seed", "less than or equal to"),
        (json.dumps({"prompt": "x", "frobnicate": 1}).encode(), 400, "frobnicate", "unknown parameter"),
        (json.dumps({"prompt": "x", "model": "gpt-9"}).encode(), 404, "model", "does not exist"),
    ],
)
def test_bad_requests_get_openai_errors_and_server_keeps_serving(server, payload, status, param, words):
    r = httpx.post(f"{server}/v1/completions", content=payload, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["param"] == param and words in err["message"]
    ok = httpx.post(f"{server}/v1/completions", json={"prompt": "x = 1", "max_tokens": 2}, timeout=60)
    assert ok.status_code == 200


def test_404_and_405_use_the_openai_shape(server):
    for r, status in ((httpx.get(f"{server}/nope"), 404), (httpx.get(f"{server}/v1/completions"), 405)):
        assert r.status_code == status
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}


def _raw(url: str, data: bytes, wait_s: float = 5.0) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=wait_s) as s:
        s.sendall(data)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except TimeoutError:
            pass
        return out


def test_oversized_body_is_refused_before_it_is_read(server):
    # the headers announce 100 MB; none of it is sent: the 413 must come from the header alone
    start = time.monotonic()
    out = _raw(server, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000000\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 413") and b'"error"' in out
    assert time.monotonic() - start < 4.0
    # a chunked body is cut off as soon as it passes the limit
    r = httpx.post(f"{server}/v1/completions", content=iter([b'{"prompt": "' + b"x" * 3000, b"x" * 3000 + b'"}']), timeout=30)
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"


def test_half_sent_body_and_headers_are_dropped(server):
    out = _raw(server, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\"")
    assert out.startswith(b"HTTP/1.1 408")
    start = time.monotonic()
    out = _raw(server, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")  # headers never finished
    assert out == b"" and time.monotonic() - start < 4.0  # closed by the server, well before the client's 5 s


def test_prometheus_metrics_and_health(server):
    from prometheus_client.parser import text_string_to_metric_families

    httpx.get(f"{server}/nope")
    text = httpx.get(f"{server}/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("specsched_requests", "specsched_http_responses", "specsched_request_latency_seconds", "specsched_time_to_first_token_seconds",
                 "specsched_inter_token_latency_seconds", "specsched_queue_depth", "specsched_calibration_factor", "specsched_round_faults"):
        assert name in families, name
    statuses = {s.labels["status"]: s.value for s in families["specsched_http_responses"].samples if s.name.endswith("_total")}
    assert statuses.get("404", 0) >= 1 and statuses.get("200", 0) >= 1
    modes = {s.labels["mode"] for s in families["specsched_calibration_factor"].samples}
    assert modes == {"ad", "sd"}
    h = httpx.get(f"{server}/health").json()
    assert h["status"] == "ok" and h["faults"] == 0
    assert httpx.get(f"{server}/stats").json()["served"] >= 1


def test_completion_endpoints_answer_a_crash_with_an_openai_500(pair, profile):
    """The completion endpoints bypass the framework's routing (runtime.api): an unexpected error in
    them still gets the OpenAI-shaped 500 the framework's crash handler gives, counted by status."""
    from runtime.api import ServeApp
    from runtime.serve_config import ServeConfig

    class Broken:
        def __getattr__(self, name):
            return getattr(pair.tokenizer, name)

        def encode(self, text):
            raise RuntimeError("tokenizer broke")

    class BrokenPair:
        def __getattr__(self, name):
            return getattr(pair, name)

        tokenizer = Broken()

    app = ServeApp(ServeConfig(scheduler="balance", profile=str(profile), max_tokens_limit=64, max_prompt_tokens=256), BrokenPair())

    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            return [await c.post(path, json=body) for path, body in (("/v1/completions", {"prompt": "x", "max_tokens": 2}),
                                                                     ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}))]

    for r in asyncio.run(go()):
        assert r.status_code == 500 and r.json()["error"]["code"] == "internal_error" and "RuntimeError" in r.json()["error"]["message"]
    assert app.metrics.counts["http"] == {"500": 2}


def _recv_response(sock: socket.socket) -> bytes:
    """One whole HTTP/1.1 response with a Content-Length (headers and body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, body = data.split(b"\r\n\r\n", 1)
    length = int(next(line.split(b":", 1)[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")))
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def _recv_until_closed(sock: socket.socket) -> bytes:
    out = b""
    while chunk := sock.recv(65536):  # the socket's timeout fails the test if the server keeps it open
        out += chunk
    return out


def test_every_request_on_a_kept_alive_connection_gets_the_header_timeout(server):
    # only a connection's first request was timed: half the headers of a second request (or a GET
    # body trickled after its answer) held the connection and a file descriptor for good
    host, port = server.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=4.0) as s:  # header_timeout_s=0.5; uvicorn's keep-alive is 5 s
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _recv_response(s).startswith(b"HTTP/1.1 200")
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # half a second request, then silence
        assert _recv_until_closed(s) == b""
    with socket.create_connection((host, int(port)), timeout=4.0) as s:
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nContent-Length: 3000\r\n\r\n")  # under max_body_bytes
        assert _recv_response(s).startswith(b"HTTP/1.1 200")  # answered without reading the body
        closed = False
        for _ in range(30):  # a byte every 0.1 s: each one used to cancel uvicorn's keep-alive timer
            try:
                s.sendall(b"x")
            except OSError:
                closed = True
                break
            time.sleep(0.1)
        assert closed or _recv_until_closed(s) == b""
    assert httpx.get(f"{server}/health", timeout=10).status_code == 200  # pipelined and ordinary keep-alive still served


def test_keep_alive_requests_in_a_row_are_served(server):
    with httpx.Client(timeout=30) as c:  # one connection, several requests, gaps shorter than the header timeout
        for _ in range(3):
            assert c.get(f"{server}/health").status_code == 200
            time.sleep(0.3)


def test_malformed_http_gets_the_openai_error_shape(server):
    # uvicorn answered these with a plain-text "Invalid HTTP request received."
    for raw in (b"GARBAGE\r\n\r\n", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}"):
        out = _raw(server, raw)
        assert out.startswith(b"HTTP/1.1 400"), out[:100]
        err = json.loads(out.split(b"\r\n\r\n", 1)[1])["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["code"] == "invalid_http"
