"""The load generator's red-team finds: flags that must be real booleans, URLs the lean client cannot
reach refused up front, and a stop (SIGTERM) that leaves exactly one row for every request sent."""

import math
import signal
import subprocess
import sys
import time

import httpx
import pandas as pd
import pytest
from live_server import ROOT, running

GOOD = {"env": {}, "url": "http://127.0.0.1:8011", "rounds": 1, "users": 2, "seed": 0, "time_scale": 1.0, "token_scale": 1.0,
        "max_tokens_cap": 64, "round_gap_s": 0.0, "timeout_s": 10.0, "stream": True, "wait_rounds": True}


@pytest.mark.parametrize("key", ["stream", "wait_rounds"])
@pytest.mark.parametrize("value", ["no", "false", "", 0, 1, None, math.nan])
def test_flags_must_be_booleans(key, value):
    from runtime.loadgen import validate

    validate({**GOOD, key: False})
    with pytest.raises(ValueError, match=f"'{key}' must be true or false"):
        validate({**GOOD, key: value})


def test_flags_default_to_true_when_left_out():
    from runtime.loadgen import validate

    validate({k: v for k, v in GOOD.items() if k not in ("stream", "wait_rounds")})  # the experiments' own configs leave them out


@pytest.mark.parametrize("url", ["https://127.0.0.1:8011", "http://127.0.0.1:99999", "http://127.0.0.1:0", "http://127.0.0.1:port", "ftp://127.0.0.1:21",
                                 "http://:8011", "http://127.0.0.1:8011?x=1", "http://127.0.0.1:8011#top", "http://u:p@127.0.0.1:8011", 8011])
def test_url_the_client_cannot_reach_is_refused(url):
    from runtime.loadgen import validate

    with pytest.raises(ValueError, match=r"loadgen 'url' must be an http://HOST:PORT address \(port 1\.\.65535"):
        validate({**GOOD, "url": url})


@pytest.mark.parametrize("url", ["http://127.0.0.1:1", "http://127.0.0.1:65535", "http://localhost", "http://127.0.0.1:8011/prefix/"])
def test_url_the_client_can_reach_is_accepted(url):
    from runtime.loadgen import validate

    validate({**GOOD, "url": url})


@pytest.mark.parametrize("override, field", [("stream=no", "stream"), ("wait_rounds=yes", "wait_rounds"), ("url=https://127.0.0.1:1", "url"),
                                             ("url=http://127.0.0.1:99999", "url")])
def test_command_refuses_before_sending(override, field, tmp_path):
    """Was: exit 0 and streamed (``stream=no``), or every row an error (the URLs)."""
    out = tmp_path / "never.csv"
    res = subprocess.run([sys.executable, "-m", "runtime.loadgen", "url=http://127.0.0.1:1", "rounds=1", "users=2", override, f"output={out}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode != 0 and f"loadgen '{field}'" in res.stderr, res.stderr[-2000:]
    assert not out.exists()  # refused before a single request (or an empty CSV)


# ------------------------------------------------------------------------------ stop mid-run


@pytest.fixture(scope="module")
def held_server(pair, profile):
    """A live server whose target passes the test can hold (requests stay in flight as long as it likes)."""
    from test_serve_faults import _faulty_pair, wait_warm

    slow, hook = _faulty_pair(pair, fail_on=set())
    with running(slow, profile, max_queue=4096) as srv:
        wait_warm(srv.url)
        try:
            yield srv.url, hook
        finally:
            hook.release()  # a failed test must not leave the server's round waiting at the gate


def _answered_by_server(url: str) -> int:
    """Completion requests the server has answered so far (its Prometheus counters, every status)."""
    from prometheus_client.parser import text_string_to_metric_families

    fam = {f.name: f for f in text_string_to_metric_families(httpx.get(f"{url}/metrics").text)}
    return int(sum(s.value for s in fam["specsched_requests"].samples if s.name.endswith("_total")))


def _wait_idle(url: str, timeout_s: float = 60) -> None:
    for _ in range(int(timeout_s / 0.1)):
        h = httpx.get(f"{url}/health").json()
        if h["queued"] + h["running"] == 0:
            return
        time.sleep(0.1)
    raise AssertionError("the server still had requests after 60 s")


def test_sigterm_mid_run_records_every_request_sent(held_server, tmp_path):
    """Was: the requests in flight at SIGTERM vanished (the server answered 380, the CSV had 291)."""
    from runtime.loadgen import COLUMNS

    server, hook = held_server
    _wait_idle(server)
    before = _answered_by_server(server)
    out = tmp_path / "stopped.csv"
    # rounds overlap (wait_rounds=false): when the stop comes, requests are queued and running on the server
    proc = subprocess.Popen([sys.executable, "-m", "runtime.loadgen", f"url={server}", "rounds=60", "users=8", "wait_rounds=false", "round_gap_s=0.1",
                             "token_scale=0.2", "max_tokens_cap=16", "time_scale=20", f"output={out}"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(1200):  # until a few rows are on disk (flushed row by row)
            if out.exists() and len(out.read_text().splitlines()) > 4:
                break
            time.sleep(0.1)
        # hold the device: the round on it and the requests queued behind it stay in flight for
        # longer than the stop's grace, whatever the host's speed
        hook.hold()
        assert hook.entered.wait(60), "no round reached the device"
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        hook.release()
        proc.kill()
    assert proc.returncode == 0, stderr[-2000:]
    _wait_idle(server)
    sent_by_server = _answered_by_server(server) - before
    rows = pd.read_csv(out)
    assert list(rows.columns) == COLUMNS and rows.outcome.notna().all()
    assert not rows.duplicated(["round", "user"]).any()
    seen = f"outcomes {rows.outcome.value_counts().to_dict()}, server {sent_by_server}; {stdout[-1500:]}"
    stopped = rows[rows.outcome == "interrupted"]
    # every request the server got has a row (the old code lost those in flight); an interrupted one
    # may never have reached the server's app (it counts none whose client left before it was read)
    assert len(rows) - len(stopped) <= sent_by_server <= len(rows), seen
    assert len(stopped) >= 1, seen  # the stop did meet requests in flight
    assert stopped.latency_s.isna().all() and stopped.status.isna().all()
    summary = pd.read_csv(tmp_path / "stopped_summary.csv").iloc[0]
    assert bool(summary.interrupted)
    assert summary.requests == len(rows) == summary.answered + summary.in_flight_at_stop
    assert summary.in_flight_at_stop == len(stopped)
    assert summary.answered == summary.served + summary.late + summary.rejected + summary.errors


def test_a_stop_while_the_corpus_loads_sends_nothing(monkeypatch, tmp_path):
    # the signal handler runs only when the loop does: the check right after the (synchronous) corpus
    # load never saw it, and round 0 went out after the Ctrl-C
    import os

    import runtime.pair
    from runtime.loadgen import run

    real = runtime.pair.corpus

    def interrupted_corpus(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        return real(*args, **kwargs)

    monkeypatch.setattr(runtime.pair, "corpus", interrupted_corpus)
    rows, summary = run({**GOOD, "url": "http://127.0.0.1:1", "output": str(tmp_path / "rows.csv")})
    assert len(rows) == 0 and bool(summary.interrupted.iloc[0])


def test_a_cancelled_request_closes_its_connection():
    # __aexit__ does not run when __aenter__ is cancelled: the socket stayed open until garbage collection
    import asyncio

    from runtime.lean_http import post_json

    async def go():
        closed = asyncio.Event()

        async def never_answer(reader, writer):
            await reader.read()  # returns at EOF: the client closed its side
            closed.set()
            writer.close()

        server = await asyncio.start_server(never_answer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]

        async def request():
            async with post_json(f"http://127.0.0.1:{port}", "/v1/completions", {}) as resp:
                return resp.status

        async with server:
            task = asyncio.ensure_future(request())
            await asyncio.sleep(0.2)  # sent, waiting for a status line
            task.cancel()
            await asyncio.wait_for(closed.wait(), timeout=10)

    asyncio.run(go())
