"""The live server under faults, overflow, deadlines it cannot meet, and shutdown: every request ends
with exactly the outcome named, and the server keeps serving."""

import asyncio
import copy
import json
import threading
import time

import httpx
from live_server import running

from runtime.pair import ModelPair


class FaultyForward:
    """A model forward that raises on the calls whose numbers are in ``fail_on`` (1-based)."""

    def __init__(self, model, fail_on: set[int]):
        self.model, self.fail_on, self.calls = model, fail_on, 0
        self.pause_s = 0.0  #: set > 0 to make every pass that much slower (a slow device)
        self.inner = model.forward
        self.gate = threading.Event()  #: while cleared (after hold()), every pass waits for it
        self.gate.set()
        self.entered = threading.Event()  #: a pass has started waiting at the gate

    def hold(self) -> None:
        """Make the next passes wait until :meth:`release` (the round running them stays on the device)."""
        self.entered.clear()
        self.gate.clear()

    def release(self) -> None:
        self.gate.set()

    def arm(self, after: int, count: int = 1) -> None:
        """Fail the ``after``-th call from now (and the ``count - 1`` following ones)."""
        self.fail_on = set(range(self.calls + after, self.calls + after + count))

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if not self.gate.is_set():
            self.entered.set()
            assert self.gate.wait(60), "the test never released the gate"
        if self.pause_s:
            time.sleep(self.pause_s)
        if self.calls in self.fail_on:
            raise RuntimeError(f"injected fault on forward call {self.calls}")
        return self.inner(*args, **kwargs)


def _faulty_pair(pair, fail_on):
    target = copy.deepcopy(pair.target)
    hook = FaultyForward(target, fail_on)
    target.forward = hook  # nn.Module.__call__ runs the instance's forward
    return ModelPair(target, pair.draft, pair.tokenizer, pair.path), hook


def wait_warm(url: str) -> None:
    """Until the server's warm-up run is done (it makes forward passes of its own)."""
    for _ in range(600):
        if httpx.get(f"{url}/health").json()["warmed_up"]:
            return
        time.sleep(0.05)
    raise AssertionError("the server did not warm up within 30 s")


def _post_all(url: str, payloads: list[dict], timeout: float = 60):
    async def go():
        async with httpx.AsyncClient(timeout=timeout) as c:
            return await asyncio.gather(*[c.post(f"{url}/v1/completions", json=p) for p in payloads])

    return asyncio.run(go())


def _final_event(resp) -> dict:
    events = [json.loads(line[6:]) for line in resp.text.splitlines() if line.startswith("data: {") and '"specsched"' in line]
    return events[-1]


def _queued(url: str, n: int) -> None:
    for _ in range(1200):
        if httpx.get(f"{url}/health").json()["queued"] >= n:
            return
        time.sleep(0.05)
    raise AssertionError(f"{n} requests were not queued within 60 s")


def test_engine_fault_ends_the_round_with_error_and_the_server_carries_on(pair, profile):
    """Two requests in one round whose third target pass raises. They are put in the same round for
    sure: a one-pass blocker round holds the device (its only pass waits at a gate) until both are
    queued, so the next round takes both, whatever the host's speed."""
    bad, hook = _faulty_pair(pair, fail_on=set())
    with running(bad, profile, window_s=0.3, calibration_probe_s=0) as srv:
        url = srv.url
        wait_warm(url)
        hook.hold()
        # a one-token prompt and one output token: exactly one target pass in AD (prefill) and in SD (one verify)
        blocker = threading.Thread(target=lambda: httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 1}, timeout=120))
        blocker.start()
        assert hook.entered.wait(60), "the blocker's pass did not start"
        result: list = []
        both = threading.Thread(target=lambda: result.extend(_post_all(url, [{"prompt": "def f(x):", "max_tokens": 16},
                                                                             {"prompt": "import os", "max_tokens": 16, "stream": True}])))
        both.start()
        _queued(url, 2)
        hook.arm(after=3)  # the blocker's pass has been counted: the third target pass of the next round, the one with both
        hook.release()
        both.join(120)
        blocker.join(120)
        plain, streamed = result
        assert plain.status_code == 500
        assert plain.json()["error"]["code"] == "engine_fault" and "injected fault" in plain.json()["error"]["message"]
        assert plain.json()["specsched"]["outcome"] == "error"
        assert streamed.status_code == 200 and _final_event(streamed)["specsched"]["outcome"] == "error"
        # the loop carries on: the next round is served
        again = httpx.post(f"{url}/v1/completions", json={"prompt": "class A:", "max_tokens": 8}, timeout=60)
        assert again.status_code == 200 and again.json()["specsched"]["outcome"] == "served"
        health = httpx.get(f"{url}/health").json()
        assert health["status"] == "degraded" and health["faults"] == 1 and "injected fault" in health["last_fault"]["error"]
        text = httpx.get(f"{url}/metrics").text
        assert 'specsched_round_faults_total 1.0' in text
        assert 'specsched_requests_total{outcome="error"} 2.0' in text
        assert 'specsched_http_responses_total{status="500"} 1.0' in text
    assert hook.calls > 3


def test_queue_full_gets_503_and_overflow_carries_to_the_next_round(pair, profile):
    with running(pair, profile, window_s=0.3, max_round=2, max_queue=5) as srv:
        url = srv.url
        responses = _post_all(url, [{"prompt": f"x = {i}", "max_tokens": 4, "deadline_s": 60} for i in range(7)])
        codes = sorted(r.status_code for r in responses)
        assert codes == [200] * 5 + [503] * 2
        refused = [r for r in responses if r.status_code == 503]
        assert all(r.json()["error"]["code"] == "overloaded" and "max_queue" in r.json()["error"]["message"] for r in refused)
        served = [r.json()["specsched"] for r in responses if r.status_code == 200]
        assert [s["outcome"] for s in served] == ["served"] * 5
        stats = httpx.get(f"{url}/stats").json()
        assert stats["rounds"] == 3  # 5 requests, 2 per round: the overflow carried over, none was dropped


def test_queued_requests_that_cannot_make_their_deadline_are_rejected_before_it(pair, profile):
    # one long round holds the device; requests queued behind it with short deadlines must be
    # answered (rejected) before their deadline, not after the long round
    with running(pair, profile, window_s=0.2, max_round=1) as srv:
        url = srv.url
        wait_warm(url)
        long = threading.Thread(target=httpx.post, args=(f"{url}/v1/completions",), kwargs={"json": {"prompt": "def f(x):", "max_tokens": 64, "deadline_s": 60}, "timeout": 120})
        long.start()
        time.sleep(0.4)  # the long request's round is running
        start = time.monotonic()
        shorts = _post_all(url, [{"prompt": "x", "max_tokens": 64, "deadline_s": 1.5} for _ in range(3)])
        long.join(timeout=120)
        for r in shorts:
            s = r.json()["specsched"] if r.status_code == 200 else r.json()["specsched"]
            if s["outcome"] == "rejected":
                assert s["reason"].startswith("deadline") or s["reason"].startswith("admission")
                assert s["latency_s"] < 1.5  # answered before its deadline
            else:
                assert s["outcome"] == "served"
        assert time.monotonic() - start < 60


def _slow_pair(pair, pause_s: float):
    """The pair with a target whose every forward pass first sleeps ``pause_s`` (a slow device)."""
    slow, _ = _faulty_pair(pair, fail_on=set())
    inner = slow.target.forward

    def crawl(*args, **kwargs):
        time.sleep(pause_s)
        return inner(*args, **kwargs)

    slow.target.forward = crawl
    return slow


def test_shutdown_rejects_the_queue_finishes_the_running_round_and_refuses_new_requests(pair, profile):
    with running(_slow_pair(pair, 0.1), profile, window_s=0.2, max_round=1, shutdown_timeout_s=30, calibration_probe_s=0) as srv:
        url = srv.url
        wait_warm(url)
        results: dict[str, httpx.Response] = {}

        def call(name, payload):
            results[name] = httpx.post(f"{url}/v1/completions", json=payload, timeout=60)

        running_req = threading.Thread(target=call, args=("running", {"prompt": "def f(x):", "max_tokens": 64, "deadline_s": 60}))
        running_req.start()
        time.sleep(0.5)  # its round is on the device (>= 13 target passes of >= 0.1 s)
        queued = [threading.Thread(target=call, args=(f"queued{i}", {"prompt": "x", "max_tokens": 8, "deadline_s": 60, "stream": i == 1})) for i in range(2)]
        [t.start() for t in queued]
        for _ in range(200):  # both are queued behind the running round
            if httpx.get(f"{url}/stats").json()["queued"] == 2:
                break
            time.sleep(0.02)
        assert httpx.get(f"{url}/stats").json()["queued"] == 2
        srv.should_exit = True
        time.sleep(0.25)  # uvicorn notices within 0.1 s
        late = httpx.post(f"{url}/v1/completions", json={"prompt": "y", "max_tokens": 2}, timeout=10)
        running_req.join(timeout=60)
        [t.join(timeout=60) for t in queued]
    assert late.status_code == 503 and late.json()["error"]["code"] == "shutting_down"
    assert results["running"].status_code == 200 and results["running"].json()["specsched"]["outcome"] in ("served", "late")
    assert results["queued0"].status_code == 429 and results["queued0"].json()["specsched"]["reason"].startswith("shutdown")
    assert _final_event(results["queued1"])["specsched"]["outcome"] == "rejected"


def test_shutdown_is_bounded_by_shutdown_timeout(pair, profile):
    slow = _slow_pair(pair, 0.2)  # a device far slower than planned
    with running(slow, profile, window_s=0.1, shutdown_timeout_s=1.0, calibration_probe_s=0) as srv:
        url = srv.url
        wait_warm(url)
        box = {}
        t = threading.Thread(target=lambda: box.setdefault("r", httpx.post(f"{url}/v1/completions", json={"prompt": "a", "max_tokens": 64, "deadline_s": 60, "stream": True}, timeout=60)))
        t.start()
        time.sleep(0.6)
        start = time.monotonic()
        srv.should_exit = True
        t.join(timeout=30)
        while srv.started and not srv.should_exit:
            time.sleep(0.05)
    took = time.monotonic() - start
    assert took < 1.0 + 2.0 + 1.5  # shutdown_timeout_s + the connections' grace + slack
    final = _final_event(box["r"])["specsched"]
    assert final["outcome"] == "error" and final["reason"].startswith("shutdown")


def test_a_body_still_arriving_at_shutdown_gets_a_503_not_a_500(pair, profile):
    # uvicorn cancels such a request when its shutdown grace ends; the cancellation became its plain-text 500
    import socket

    with running(pair, profile, body_timeout_s=60) as srv:
        host, port = srv.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=30) as s:
            s.sendall(b'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 40\r\n\r\n{"prompt":')
            time.sleep(0.3)
            srv.should_exit = True
            out = b""
            while chunk := s.recv(65536):
                out += chunk
    assert out.startswith(b"HTTP/1.1 503"), out[:200]
    body = json.loads(out.split(b"\r\n\r\n", 1)[1])
    assert body["error"]["code"] == "shutting_down"
