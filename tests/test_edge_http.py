"""The edge process's local OpenAI endpoint (``runtime.edge --listen``), end to end on loopback.

A verification server (``runtime.split_server``) and an edge process with ``--listen 127.0.0.1:0``
run as real processes; the tests speak real HTTP to the edge (httpx, and the ``openai`` client).
Greedy output must equal the target's AD output token for token, streamed chunks must assemble to
the same text, a malformed request gets 400 naming the field, a full queue 429, a client that goes
away frees its edge client, and a killed server gives an error answer (not a hang). Every process
is stopped by the test that started it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from runtime.engines import generate_ad

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
STARTUP_S = 180.0  # loading the pair in two processes on a loaded 2-core host


def _started(proc: subprocess.Popen, marker: str) -> str:
    """The rest of the line where ``proc`` prints ``marker`` (read with a deadline)."""
    found: list[str] = []

    def read() -> None:
        for line in proc.stdout:
            if marker in line:
                found.append(line.split(marker, 1)[1].strip())
                return

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(STARTUP_S)
    if not found:
        proc.kill()
        raise RuntimeError(f"{proc.args[2]} did not print {marker!r} within {STARTUP_S} s (exit code {proc.poll()})")
    threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()  # keep draining its output
    return found[0]


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(30)


@contextmanager
def edge_and_server(tmp_path: Path, *edge_args: str):
    """A tiny-pair verification server and an edge process serving HTTP in front of it; yields
    ``(base_url, server_process, edge_process)``; both are stopped after."""
    server = subprocess.Popen([sys.executable, "-m", "runtime.split_server", "--preset", "tiny", "--port", "0", "--cohorts", "2"],
                              cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    edge = None
    try:
        addr = _started(server, "listening on ")
        edge = subprocess.Popen([sys.executable, "-m", "runtime.edge", "--preset", "tiny", "--server", addr, "--listen", "127.0.0.1:0",
                                 "--connect-timeout-s", "3", "--reply-timeout-s", "5", "--summary", str(tmp_path / "summary.json"), *edge_args],
                                cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        url = _started(edge, "listening on ")
        yield url, server, edge
    finally:
        if edge is not None:
            _stop(edge)
        _stop(server)


@pytest.fixture(scope="module")
def edge_url(tmp_path_factory):
    """One edge process for the module: 2 clients, at most 1 waiting request, 10 ms RTT."""
    with edge_and_server(tmp_path_factory.mktemp("edge"), "--clients", "2", "--http-queue", "1", "--rtt-ms", "10", "--depth", "auto",
                         "--http-header-timeout-s", "1") as (url, _, _):
        yield url


def sse_events(response: httpx.Response) -> list[dict]:
    events = []
    for line in response.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            events.append(json.loads(line[len("data: "):]))
    return events


def test_greedy_completion_equals_the_targets_ad_output_token_for_token(edge_url, pair):
    tok = pair.tokenizer
    for prompt in ("def add(a, b):", "The river"):
        r = httpx.post(f"{edge_url}/v1/completions", json={"prompt": prompt, "max_tokens": 24, "temperature": 0}, timeout=60)
        assert r.status_code == 200, r.text
        body = r.json()
        ad = generate_ad(pair.target, [tok.encode(prompt)], 24, eos_id=tok.eos_id).tokens[0]
        assert body["usage"]["completion_tokens"] == len(ad)
        assert body["choices"][0]["text"] == tok.decode(ad)
        assert body["specsched"]["outcome"] in ("length", "eos") and body["specsched"]["iterations"] >= 1


def test_streamed_chunks_assemble_to_the_same_text(edge_url):
    req = {"prompt": "for i in range(", "max_tokens": 20}
    whole = httpx.post(f"{edge_url}/v1/completions", json=req, timeout=60).json()
    with httpx.stream("POST", f"{edge_url}/v1/completions", json={**req, "stream": True, "stream_options": {"include_usage": True}}, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r)
    text = "".join(c["text"] for e in events for c in e["choices"])
    assert text == whole["choices"][0]["text"]
    finals = [c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]]
    assert finals == [whole["choices"][0]["finish_reason"]]
    assert events[-1]["usage"] == whole["usage"]


def test_chat_with_the_openai_client_streamed_and_not(edge_url):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{edge_url}/v1", api_key="unused", max_retries=0, timeout=60)
    assert [m.id for m in client.models.list().data] == ["specsched"]
    messages = [{"role": "user", "content": "write a loop"}]
    full = client.chat.completions.create(model="specsched", messages=messages, max_tokens=16)
    parts = [c.choices[0].delta.content or "" for c in client.chat.completions.create(model="specsched", messages=messages, max_tokens=16, stream=True)
             if c.choices]
    assert full.choices[0].message.content == "".join(parts) and full.usage.completion_tokens == 16


@pytest.mark.parametrize(("body", "param"), [({"prompt": "x", "max_tokens": 0}, "max_tokens"), ({"max_tokens": 4}, "prompt"),
                                             ({"prompt": "x", "temperature": 5}, "temperature"), ({"prompt": "x", "top_p": 0.5}, "top_p"),
                                             ({"prompt": "x", "max_tokens": 100000}, "max_tokens"), ({"prompt": "x", "n": 2}, "n")])
def test_a_malformed_request_gets_400_naming_the_field(edge_url, body, param):
    r = httpx.post(f"{edge_url}/v1/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and param in r.json()["error"]["message"]
    if param == "max_tokens":  # the allowed range with both ends, the upper one the configured limit
        assert "[1, " in r.json()["error"]["message"], r.text


def test_chat_without_messages_and_a_body_that_is_not_json_get_400(edge_url):
    r = httpx.post(f"{edge_url}/v1/chat/completions", json={"max_tokens": 4}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    r = httpx.post(f"{edge_url}/v1/completions", content=b"{not json", timeout=30)
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]


def test_a_full_queue_answers_429_at_once_and_every_request_ends_once(edge_url):
    results: list[httpx.Response] = []
    lock = threading.Lock()

    def send() -> None:
        r = httpx.post(f"{edge_url}/v1/completions", json={"prompt": "def f(x):", "max_tokens": 120}, timeout=120)
        with lock:
            results.append(r)

    threads = [threading.Thread(target=send) for _ in range(6)]  # 2 clients + 1 waiting: at least 3 refused
    for t in threads:
        t.start()
    for t in threads:
        t.join(150)
    statuses = sorted(r.status_code for r in results)
    assert len(results) == 6 and set(statuses) <= {200, 429} and statuses.count(429) >= 3, statuses
    refused = next(r for r in results if r.status_code == 429).json()["error"]
    assert refused["code"] == "overloaded" and "--http-queue" in refused["message"]
    health = httpx.get(f"{edge_url}/health", timeout=30).json()
    assert health["busy"] == 0 and health["queued"] == 0


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_goes_away_frees_its_edge_client(edge_url, stream):
    before = httpx.get(f"{edge_url}/health", timeout=30).json()["outcomes"].get("cancelled", 0)
    body = {"prompt": "def f(x):", "max_tokens": 500, "stream": stream}
    if stream:
        with httpx.stream("POST", f"{edge_url}/v1/completions", json=body, timeout=60) as r:
            next(r.iter_lines())  # the first event, then hang up
    else:
        with pytest.raises(httpx.ReadTimeout):  # 500 tokens at 10 ms a round trip take longer (>= 0.6 s): the client gives up and hangs up
            httpx.post(f"{edge_url}/v1/completions", json=body, timeout=httpx.Timeout(30, read=0.2))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        health = httpx.get(f"{edge_url}/health", timeout=30).json()
        if health["outcomes"].get("cancelled", 0) > before and health["busy"] == 0:
            break
        time.sleep(0.1)
    assert health["outcomes"].get("cancelled", 0) == before + 1 and health["busy"] == 0, health


def test_a_killed_server_gives_error_answers_not_a_hang(tmp_path, pair):
    with edge_and_server(tmp_path, "--clients", "1", "--rtt-ms", "20", "--depth", "2") as (url, server, edge):
        assert httpx.post(f"{url}/v1/completions", json={"prompt": "x = ", "max_tokens": 4}, timeout=60).status_code == 200
        with httpx.stream("POST", f"{url}/v1/completions", json={"prompt": "def f(x):", "max_tokens": 300, "stream": True}, timeout=60) as r:
            lines = r.iter_lines()
            next(lines)  # running: now the server dies under it
            server.send_signal(signal.SIGKILL)
            events = [json.loads(line[6:]) for line in lines if line.startswith("data: ") and line != "data: [DONE]"]
        assert events[-1]["choices"][0]["finish_reason"] == "error" and events[-1]["specsched"]["outcome"] == "error"
        # no server to reconnect to: an answer after the connect timeout (3 s); a hang would raise httpx's timeout
        r = httpx.post(f"{url}/v1/completions", json={"prompt": "x = ", "max_tokens": 4}, timeout=60)
        assert r.status_code == 502 and r.json()["error"]["code"] == "verification_server_error", r.text
        edge.send_signal(signal.SIGTERM)  # stops by itself and reports every request's one outcome
        assert edge.wait(60) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["requests"] == 3 and summary["outcomes"] == {"length": 1, "error": 2}, summary["outcomes"]


def test_a_connection_that_never_finishes_its_headers_is_closed_by_the_edge(edge_url):
    """Without a header timeout such a connection stayed open for good (a red-team's find)."""
    host, port = edge_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")  # headers never finished
        assert s.recv(65536) == b""  # the edge closed it (a TimeoutError after 60 s would fail the test)


@pytest.mark.parametrize("body, param", [({"prompt": "x", "stream": "yes"}, "stream"), ({"prompt": "x", "max_tokens": True}, "max_tokens"),
                                         ({"prompt": [1, 2]}, "prompt"), ({"prompt": "x", "stop": [""]}, "stop")])
def test_lax_values_are_refused_naming_the_field(edge_url, body, param):
    r = httpx.post(f"{edge_url}/v1/completions", json=body, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_the_chat_token_limit_names_the_field_that_was_sent(edge_url):
    r = httpx.post(f"{edge_url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 100000}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_completion_tokens", r.text


def test_bad_listen_arguments_fail_fast():
    from runtime.edge import parse_args

    for args, words in ((["--listen", "nohost"], "--listen"), (["--listen", "127.0.0.1:70000"], "--listen"),
                        (["--listen", "--placement", "on"], "--placement off"), (["--listen", "--http-queue", "-1"], "--http-queue"),
                        (["--alpha", "1.5"], "--alpha"), (["--profile", "split_cpu1_specsched-pair", "--placement", "on"], "--placement on")):
        with pytest.raises(SystemExit) as exc:
            parse_args(["--server", "127.0.0.1:1", *args])
        assert words in str(exc.value), args


def test_the_edge_process_drafts_its_first_block_at_the_models_calibrated_depth(tmp_path, pair):
    """``--profile``: the prompt-list mode's controllers start at the rule's depth for ``--rtt-ms``
    (the first iteration of every request's first client is drafted at it), reported in the summary."""
    from runtime.edge_profile import calibrated_start
    from runtime.pair import CODE_PROMPTS, PROSE_PROMPTS

    server = subprocess.Popen([sys.executable, "-m", "runtime.split_server", "--preset", "tiny", "--port", "0", "--idle-exit-s", "1"],
                              cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        addr = _started(server, "listening on ")
        edge = subprocess.run([sys.executable, "-m", "runtime.edge", "--preset", "tiny", "--server", addr, "--clients", "2", "--requests", "1",
                               "--max-new-tokens", "24", "--rtt-ms", "5", "--depth", "auto", "--profile", "split_cpu1_specsched-pair", "--alpha", "0.8",
                               "--log", str(tmp_path / "log.jsonl"), "--summary", str(tmp_path / "summary.json")],
                              cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
        assert edge.returncode == 0, edge.stderr[-2000:]
    finally:
        _stop(server)
    prompts = [pair.tokenizer.encode(p) for p in CODE_PROMPTS + PROSE_PROMPTS]
    context = sum(len(p) for p in prompts) / len(prompts) + 24 / 2
    expected = calibrated_start("split_cpu1_specsched-pair", 0.8, 0.005, 2, context, 8)
    assert expected.depth != 4  # the start without a profile: the check discriminates
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["calibrated"] == expected.as_dict() and summary["outcomes"] == {"length": 2}
    logs = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    firsts = [log["depth"] for log in logs if log["iteration"] == 0]
    assert firsts == [expected.depth] * 2, (firsts, expected)
