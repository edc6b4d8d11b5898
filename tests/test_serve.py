"""Runtime II: the live server on loopback with the tiny pair (started and stopped inside the test)."""

import json
import threading
import time

import httpx
import pytest

from runtime.serve import ServeConfig, create_app


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from runtime.pair import build_pair, load_pair

    return load_pair(build_pair(tmp_path_factory.mktemp("pair") / "tiny", "tiny", progress=False))


def _start(pair, **overrides):
    import uvicorn

    cfg = ServeConfig(**{"scheduler": "balance", "port": 0, "window_s": 0.2, "max_tokens_limit": 64, "max_prompt_tokens": 256, "default_deadline_s": 20.0, **overrides})
    srv = uvicorn.Server(uvicorn.Config(create_app(cfg, pair), host="127.0.0.1", port=0, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    for _ in range(400):
        if srv.started:
            break
        time.sleep(0.05)
    return srv, thread, f"http://127.0.0.1:{srv.servers[0].sockets[0].getsockname()[1]}"


@pytest.fixture(scope="module")
def server(pair):
    srv, thread, url = _start(pair)
    yield url
    srv.should_exit = True
    thread.join(timeout=30)


def test_shutdown_finishes_what_is_in_flight(pair):
    srv, thread, url = _start(pair, window_s=0.5)
    result = {}

    def call():
        result["r"] = httpx.post(f"{url}/v1/completions", json={"prompt": "def h():", "max_tokens": 8}, timeout=60)

    client = threading.Thread(target=call)
    client.start()
    time.sleep(0.2)  # the request is queued in the open round
    srv.should_exit = True
    client.join(timeout=60)
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert result["r"].status_code == 200
    assert result["r"].json()["specsched"]["outcome"] in ("served", "late", "rejected")


def test_bad_config_is_refused():
    with pytest.raises(ValueError, match="window_s"):
        ServeConfig(window_s=0).validate()


def test_completion_served(server):
    r = httpx.post(f"{server}/v1/completions", json={"prompt": "def f(x):", "max_tokens": 8, "deadline_s": 20}, timeout=60)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["specsched"]["outcome"] == "served" and body["specsched"]["mode"] in ("ad", "sd")
    assert body["usage"]["completion_tokens"] == 8


def test_streaming_with_openai_client(server):
    from openai import OpenAI

    client = OpenAI(base_url=f"{server}/v1", api_key="unused")
    pieces = [c.choices[0].text for c in client.completions.create(model="specsched", prompt="import os", max_tokens=6, stream=True, extra_body={"deadline_s": 20})]
    assert len(pieces) >= 2 and "".join(pieces)


@pytest.mark.parametrize(
    "payload,status,words",
    [
        (b"{not json", 400, "JSON"),
        (json.dumps({"max_tokens": 4}).encode(), 400, "prompt"),
        (json.dumps({"prompt": "x", "max_tokens": 10_000}).encode(), 400, "max_tokens"),
        (json.dumps({"prompt": "x", "max_tokens": 4, "deadline_s": -1}).encode(), 400, "deadline_s"),
        (json.dumps({"prompt": "x" * 1000, "max_tokens": 4}).encode(), 413, "limit"),
    ],
)
def test_bad_requests_get_4xx_and_server_keeps_serving(server, payload, status, words):
    r = httpx.post(f"{server}/v1/completions", content=payload, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == status and words in r.json()["error"]["message"]
    ok = httpx.post(f"{server}/v1/completions", json={"prompt": "x = 1", "max_tokens": 2}, timeout=60)
    assert ok.status_code == 200


def test_overload_rejects_by_admission(server):
    """Deadlines no batch can meet are rejected up front, not served late."""
    import asyncio

    async def burst():
        async with httpx.AsyncClient(timeout=60) as c:
            reqs = [c.post(f"{server}/v1/completions", json={"prompt": "def g():", "max_tokens": 64, "deadline_s": 0.25}) for _ in range(6)]
            return await asyncio.gather(*reqs)

    outcomes = [r.json()["specsched"]["outcome"] for r in asyncio.run(burst())]
    assert outcomes.count("rejected") >= 1
    assert all(o in ("served", "late", "rejected") for o in outcomes)
    m = httpx.get(f"{server}/metrics", timeout=10).json()
    assert m["rejected"] >= 1 and m["requests"] >= 6 and m["rounds"] >= 1


def test_loadgen_against_the_server(server, tmp_path):
    from pathlib import Path

    from omegaconf import OmegaConf

    from runtime.loadgen import run

    env = OmegaConf.to_container(OmegaConf.load(Path(__file__).resolve().parent.parent / "conf" / "env" / "paper.yaml"))
    out = tmp_path / "run.csv"
    df, summary = run({"env": env, "url": server, "rounds": 2, "users": 4, "seed": 0, "time_scale": 1.0, "token_scale": 0.1, "max_tokens_cap": 16, "round_gap_s": 0.0, "output": str(out), "timeout_s": 120})
    assert len(df) == 8 and out.exists()
    for col in ("prompt_tokens", "max_tokens", "deadline_s", "mode", "outcome", "ttft_s", "latency_s"):
        assert col in df.columns
    assert set(df.outcome) <= {"served", "late", "rejected"}
    assert {"served_frac", "latency_p50_s", "latency_p99_s", "tokens_per_s"} <= set(summary.columns)


def test_sim_vs_real_end_to_end(pair, tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    res = subprocess.run(cwd=Path(__file__).resolve().parent.parent, args=[sys.executable, "-m", "experiments.sim_vs_real", "--schedulers", "balance", "--rounds", "1", "--users", "3", "--token-scale", "0.05", "--pair", str(pair.path), "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    text = (tmp_path / "sim_vs_real.md").read_text()
    assert "served (sim)" in text and "By mode" in text


def test_overload_end_to_end(pair, tmp_path):
    """More requests per round than the server can carry: the excess is rejected, not served late."""
    import subprocess
    import sys
    from pathlib import Path

    import pandas as pd

    res = subprocess.run(cwd=Path(__file__).resolve().parent.parent, args=[sys.executable, "-m", "experiments.overload", "--users", "2,24", "--rounds", "1", "--token-scale", "0.2",
                                                                           "--time-scale", "0.1", "--pair", str(pair.path), "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    df = pd.read_csv(tmp_path / "overload.csv")
    assert set(df.outcome) <= {"served", "late", "rejected"}
    big = df[df.users_per_round == 24]
    assert (big.outcome == "rejected").sum() >= 1
    assert len(big) == 24 and big.reason[big.outcome == "rejected"].str.startswith("admission").all()
    assert "# Overload" in (tmp_path / "overload.md").read_text()


def test_run_parallel_runs_both_batches_at_once(pair):
    import copy

    from runtime.engines import ad_steps, generate_ad, generate_sd, sd_steps
    from runtime.serve import run_parallel

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
    assert out["ad"].tokens == generate_ad(pair.target, prompts, 24, pad_id=tok.pad_id).tokens
    assert out["sd"].tokens == generate_sd(pair.target, pair.draft, prompts, 3, 24, pad_id=tok.pad_id).tokens
    # both ran at once: each one's steps began before the other's ended
    assert steps["ad"] and steps["sd"]
    assert steps["ad"][0] < steps["sd"][-1] and steps["sd"][0] < steps["ad"][-1]


def test_two_devices_serve_the_same_text(pair, server):
    srv, thread, url = _start(pair, devices=["cpu", "cpu"], scheduler="random")
    try:
        prompts = ["def f(x):", "import os", "class A:", "for i in", "return x", "while True:"]
        got, ref = {}, {}

        def call(p, base, box):
            box[p] = httpx.post(f"{base}/v1/completions", json={"prompt": p, "max_tokens": 12, "deadline_s": 30}, timeout=60).json()

        for base, box in ((url, got), (server, ref)):
            threads = [threading.Thread(target=call, args=(p, base, box)) for p in prompts]
            [t.start() for t in threads]
            [t.join(timeout=60) for t in threads]
        modes = {b["specsched"]["mode"] for b in got.values()}
        assert modes <= {"ad", "sd", "-"}
        for p in prompts:
            if got[p]["specsched"]["outcome"] != "rejected" and ref[p]["specsched"]["outcome"] != "rejected":
                assert got[p]["choices"][0]["text"] == ref[p]["choices"][0]["text"]
        assert sum(b["specsched"]["outcome"] == "served" for b in got.values()) >= 1
    finally:
        srv.should_exit = True
        thread.join(timeout=30)
    with pytest.raises(ValueError, match="devices"):
        ServeConfig(devices=["cuda:0"]).validate()


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA")
def test_two_devices_on_cuda(pair):
    import copy

    import torch

    from runtime.pair import ModelPair
    from runtime.serve import RoundServer

    devices = ["cuda:0", f"cuda:{min(1, torch.cuda.device_count() - 1)}"]
    gpu_pair = ModelPair(copy.deepcopy(pair.target), copy.deepcopy(pair.draft), pair.tokenizer, pair.path)
    server = RoundServer(ServeConfig(devices=devices, port=0), gpu_pair)
    assert str(next(server.ad_target.parameters()).device) == devices[0]
    assert str(next(gpu_pair.draft.parameters()).device) == devices[1]
