"""The load generator and the serving experiments against live servers, two devices, and a soak:
every request ends with exactly one outcome and the Prometheus counters add up to what was sent."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pandas as pd
import pytest
from live_server import ROOT, running
from omegaconf import OmegaConf

ENV = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "env" / "paper.yaml"))


@pytest.fixture(scope="module")
def server(pair, profile):
    with running(pair, profile) as srv:
        yield srv.url


def _cfg(url, out=None, **kw):
    return {"env": ENV, "url": url, "rounds": 2, "users": 4, "seed": 0, "time_scale": 1.0, "token_scale": 0.1, "max_tokens_cap": 16, "round_gap_s": 0.0,
            "output": str(out) if out else None, "timeout_s": 120, **kw}


def test_loadgen_writes_one_row_per_request(server, tmp_path):
    from runtime.loadgen import COLUMNS, run

    out = tmp_path / "run.csv"
    df, summary = run(_cfg(server, out))
    assert len(df) == 8
    on_disk = pd.read_csv(out)
    assert list(on_disk.columns) == COLUMNS and len(on_disk) == 8
    assert set(df.outcome) <= {"served", "late", "rejected"}
    assert (tmp_path / "run_summary.csv").exists() and not summary.interrupted.iloc[0]
    sd = df[df["mode"] == "sd"]
    assert (sd.sd_iterations >= 1).all()  # the engine's own counters reach the CSV


def test_loadgen_killed_keeps_answered_rows_and_summarises_them(server, tmp_path):
    out = tmp_path / "killed.csv"
    proc = subprocess.Popen([sys.executable, "-m", "runtime.loadgen", f"url={server}", "rounds=200", "users=3", "token_scale=0.05", "max_tokens_cap=8",
                             f"output={out}"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(1200):  # until a few rows are on disk (flushed row by row)
            if out.exists() and len(out.read_text().splitlines()) > 4:
                break
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    rows = pd.read_csv(out)
    assert len(rows) >= 4 and rows.outcome.notna().all()
    summary = pd.read_csv(tmp_path / "killed_summary.csv")
    assert int(summary.requests.iloc[0]) == len(rows) and bool(summary.interrupted.iloc[0])
    assert proc.returncode == 0, stderr[-2000:]


def test_loadgen_exits_nonzero_when_every_request_failed(tmp_path):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = subprocess.run([sys.executable, "-m", "runtime.loadgen", f"url=http://127.0.0.1:{port}", "rounds=1", "users=2", f"output={tmp_path / 'dead.csv'}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode != 0 and "every request failed" in res.stderr
    assert (pd.read_csv(tmp_path / "dead.csv").outcome == "error").all()


def test_sim_vs_real_end_to_end(pair, profile, tmp_path):
    res = subprocess.run(cwd=ROOT, args=[sys.executable, "-m", "experiments.sim_vs_real", "--schedulers", "balance", "--rounds", "1", "--users", "3", "--token-scale", "0.05",
                                         "--pair", str(pair.path), "--profile", str(profile), "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    text = (tmp_path / "sim_vs_real.md").read_text()
    assert "served (sim)" in text and "By mode" in text


def test_overload_end_to_end(pair, profile, tmp_path):
    """More requests than the server can carry: the excess is rejected (before its deadline), not served late."""
    res = subprocess.run(cwd=ROOT, args=[sys.executable, "-m", "experiments.overload", "--users", "2,24", "--rounds", "1", "--burst", "2", "--hog", "1", "--hog-max-s", "120",
                                         "--token-scale", "0.2", "--time-scale", "0.1", "--pair", str(pair.path), "--profile", str(profile), "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    df = pd.read_csv(tmp_path / "overload.csv")
    assert set(df.outcome) <= {"served", "late", "rejected"}
    big = df[df.run == "steady 24/round"]
    assert len(big) == 24 and (big.outcome == "rejected").sum() >= 1
    assert big.reason[big.outcome == "rejected"].str.match(r"^(admission|deadline)").all()
    assert len(df[df.run.str.contains("CPU hog")]) == 48
    text = (tmp_path / "overload.md").read_text()
    assert "# Overload" in text and "rejections before deadline %" in text


def test_run_parallel_runs_both_batches_at_once(pair):
    import copy

    from runtime.engines import ad_steps, generate_ad, generate_sd, sd_steps
    from runtime.executor import run_parallel

    tok = pair.tokenizer
    prompts = [tok.encode("def f(x):"), tok.encode("import sys")]
    steps: dict[str, list[float]] = {"ad": [], "sd": []}
    current = {}

    def after_step():
        steps[current[threading.get_ident()]].append(time.perf_counter())

    def tagged(name, gen):
        current[threading.get_ident()] = name
        return (yield from gen)

    other = copy.deepcopy(pair.target)
    jobs = {"ad": tagged("ad", ad_steps(other, prompts, 24, pad_id=tok.pad_id)),
            "sd": tagged("sd", sd_steps(pair.target, pair.draft, prompts, 3, 24, pad_id=tok.pad_id))}
    out = run_parallel(jobs, after_step)
    # lossless greedy: each device's result is what the engine gives alone
    assert out["ad"].result.tokens == generate_ad(pair.target, prompts, 24, pad_id=tok.pad_id).tokens
    assert out["sd"].result.tokens == generate_sd(pair.target, pair.draft, prompts, 3, 24, pad_id=tok.pad_id).tokens
    assert steps["ad"] and steps["sd"]
    assert steps["ad"][0] < steps["sd"][-1] and steps["sd"][0] < steps["ad"][-1]


def test_engine_row_ends_carry_the_results_counters(pair):
    from runtime.engines import drain, sd_steps

    tok = pair.tokenizer
    ends = {}
    prompts = [tok.encode("def f(x):"), tok.encode("import sys"), tok.encode("x")]
    res = drain(sd_steps(pair.target, pair.draft, prompts, 3, [5, 17, 9], pad_id=tok.pad_id, on_finish=lambda e: ends.setdefault(e.row, e)))
    assert sorted(ends) == [0, 1, 2]
    for i, e in ends.items():
        assert (e.tokens, e.iterations, e.accepted, e.rejections) == (len(res.tokens[i]), res.iterations[i], res.accepted[i], res.rejections[i])


def test_two_devices_serve_the_same_text(pair, profile, server):
    from runtime.serve import ServeConfig

    prompts = ["def f(x):", "import os", "class A:", "for i in", "return x", "while True:"]
    got, ref = {}, {}
    with running(pair, profile, devices=["cpu", "cpu"], scheduler="random") as srv:
        def call(p, base, box):
            box[p] = httpx.post(f"{base}/v1/completions", json={"prompt": p, "max_tokens": 12, "deadline_s": 30}, timeout=60)

        for base, box in ((srv.url, got), (server, ref)):
            threads = [threading.Thread(target=call, args=(p, base, box)) for p in prompts]
            [t.start() for t in threads]
            [t.join(timeout=60) for t in threads]
    for p in prompts:
        if got[p].status_code == 200 and ref[p].status_code == 200:
            assert got[p].json()["choices"][0]["text"] == ref[p].json()["choices"][0]["text"]
    assert sum(r.status_code == 200 and r.json()["specsched"]["outcome"] == "served" for r in got.values()) >= 1
    with pytest.raises(ValueError, match="devices"):
        ServeConfig(devices=["cuda:0"]).validate()


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA")
def test_two_devices_on_cuda(pair, profile):
    import copy

    import torch

    from runtime.pair import ModelPair
    from runtime.rounds import RoundServer
    from runtime.serve import ServeConfig

    devices = ["cuda:0", f"cuda:{min(1, torch.cuda.device_count() - 1)}"]
    gpu_pair = ModelPair(copy.deepcopy(pair.target), copy.deepcopy(pair.draft), pair.tokenizer, pair.path)
    server = RoundServer(ServeConfig(devices=devices, port=0, profile=str(profile)), gpu_pair)
    assert str(next(server.ad_target.parameters()).device) == devices[0]
    assert str(next(gpu_pair.draft.parameters()).device) == devices[1]


# ------------------------------------------------------------------------------------------ soak


def _counters(url: str) -> tuple[dict, dict]:
    from prometheus_client.parser import text_string_to_metric_families

    fam = {f.name: f for f in text_string_to_metric_families(httpx.get(f"{url}/metrics").text)}
    outcomes = {s.labels["outcome"]: s.value for s in fam["specsched_requests"].samples if s.name.endswith("_total")}
    statuses = {s.labels["status"]: s.value for s in fam["specsched_http_responses"].samples if s.name.endswith("_total")}
    return outcomes, statuses


async def _mixed_client(url: str, n: int, seed: int) -> list[dict]:
    """``n`` requests through the ``openai`` client and raw HTTP: mixed sizes and deadlines, streamed or
    not, some disconnecting early, some reading slowly. Returns what each one saw."""
    import random

    from openai import AsyncOpenAI

    rng = random.Random(seed)
    client = AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
    seen: list[dict] = []

    async def one(i: int) -> None:
        kind = rng.choice(["plain", "stream", "chat", "disconnect", "slow"])
        body = {"prompt": f"def f{i}(x):" + " y" * rng.randint(0, 40), "max_tokens": rng.randint(1, 48), "deadline_s": rng.choice([0.05, 0.5, 2.0, 8.0, 30.0])}
        sampling = rng.choice([{}, {"temperature": 0.8, "top_p": 0.9, "seed": i}, {"temperature": 1.3}])  # greedy and sampled requests share rounds
        try:
            if kind == "plain":
                r = await client.completions.with_raw_response.create(model="specsched", prompt=body["prompt"], max_tokens=body["max_tokens"], extra_body={"deadline_s": body["deadline_s"]},
                                                                      **sampling)
                seen.append({"kind": kind, "status": r.http_response.status_code})
            elif kind == "chat":
                r = await client.chat.completions.create(model="specsched", messages=[{"role": "user", "content": body["prompt"]}], max_tokens=body["max_tokens"], stream=True,
                                                         extra_body={"deadline_s": body["deadline_s"]}, **sampling)
                last = None
                async for c in r:
                    last = c
                seen.append({"kind": kind, "status": 200, "outcome": (last.model_extra or {}).get("specsched", {}).get("outcome") if last else None})
            else:
                async with httpx.AsyncClient(timeout=120) as h, h.stream("POST", f"{url}/v1/completions", json={**body, "stream": True}) as resp:
                    lines = 0
                    async for _ in resp.aiter_lines():
                        lines += 1
                        if kind == "disconnect" and lines >= 2:
                            break  # the client goes away mid-stream
                        if kind == "slow":
                            await asyncio.sleep(0.05)
                    seen.append({"kind": kind, "status": resp.status_code})
        except Exception as err:  # the openai client raises on 429 / 500 / 503: that is an answer too
            status = getattr(err, "status_code", None)
            seen.append({"kind": kind, "status": status, "error": type(err).__name__})

    await asyncio.gather(*[one(i) for i in range(n)])
    await client.close()
    return seen


def _soak(pair, profile, tmp_path, n_client: int, loadgen_rounds: int, burst_rounds: int):
    from test_serve_faults import _faulty_pair, wait_warm

    from runtime.loadgen import run as loadgen

    bad, hook = _faulty_pair(pair, fail_on=set())
    with running(bad, profile, window_s=0.2, max_queue=4096) as srv:
        url = srv.url
        wait_warm(url)
        hook.arm(after=40, count=30)  # a run of failing passes: whatever meets it (probe or round) fails, and a round does
        results = {}

        def steady():
            results["steady"] = loadgen(_cfg(url, tmp_path / "steady.csv", rounds=loadgen_rounds, users=8))[0]

        t = threading.Thread(target=steady)
        t.start()
        seen = asyncio.run(_mixed_client(url, n_client, seed=1))
        burst = loadgen(_cfg(url, tmp_path / "burst.csv", rounds=burst_rounds, users=64, wait_rounds=False, time_scale=0.5))[0]
        t.join(timeout=3600)
        outcomes, statuses = _counters(url)
        sent = n_client + len(results["steady"]) + len(burst)
        # a SIGTERM-style stop with requests in flight: every one still gets exactly one outcome
        tail = []
        threads = [threading.Thread(target=lambda: tail.append(httpx.post(f"{url}/v1/completions", json={"prompt": "z", "max_tokens": 32, "deadline_s": 30}, timeout=60).status_code))
                   for _ in range(6)]
        hook.fail_on = set()  # the fault has been met (asserted below); the stop is tested on its own
        hook.pause_s = 0.05  # a slow device: the six are still in flight when the stop comes
        [th.start() for th in threads]
        for _ in range(500):
            h = httpx.get(f"{url}/health").json()
            if h["queued"] + h["running"] == 6:
                break
            time.sleep(0.02)
        srv.should_exit = True
        [th.join(timeout=60) for th in threads]
    assert len(seen) == n_client and all(s["status"] is not None for s in seen), [s for s in seen if s["status"] is None][:3]
    for df in (results["steady"], burst):
        assert df.outcome.isin(["served", "late", "rejected", "error"]).all()
    # every request that reached the queue has one outcome; every response was counted by status
    answered_by_queue = sent - sum(v for k, v in statuses.items() if k in ("400", "404", "408", "413", "503"))
    assert sum(outcomes.values()) == answered_by_queue
    assert sum(statuses.values()) >= sent  # plus the /metrics and /stats reads
    assert outcomes["error"] >= 1  # the injected fault was met and answered
    assert sorted(set(tail)) in ([200], [429], [200, 429])  # finished, or rejected with reason shutdown
    return sent


def test_soak_fast(pair, profile, tmp_path):
    """A scaled-down soak (the default run): ~250 requests, a burst, an engine fault, a stop."""
    assert _soak(pair, profile, tmp_path, n_client=60, loadgen_rounds=3, burst_rounds=3) >= 250


@pytest.mark.slow
def test_soak_5000(pair, profile, tmp_path):
    """>= 5,000 requests: loadgen rounds, the openai client (mixed, disconnects, slow readers), a 10x burst of 640, a fault, a stop."""
    assert _soak(pair, profile, tmp_path, n_client=1600, loadgen_rounds=350, burst_rounds=10) >= 5000


def test_serve_command_validates_before_loading_and_stops_on_sigterm(pair, profile, tmp_path):
    start = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "runtime.serve", "scheduler=nosuch"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode != 0 and "scheduler" in res.stderr and time.monotonic() - start < 60
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "runtime.serve", f"target={pair.path / 'target'}", f"draft={pair.path / 'draft'}", f"profile={profile}",
                             f"port={port}", "shutdown_timeout_s=5", "window_s=0.2"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "log", "w"))
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(1200):
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        r = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 4}, timeout=60)
        assert r.status_code == 200 and json.loads(r.text)["specsched"]["outcome"] == "served"
        start = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)
        # uvicorn shuts down gracefully, then re-raises the signal it caught (exit status -SIGTERM)
        assert proc.wait(timeout=30) in (0, -signal.SIGTERM)
        assert time.monotonic() - start < 5 + 3
        assert "Finished server process" in (tmp_path / "log").read_text()
    finally:
        proc.kill()
