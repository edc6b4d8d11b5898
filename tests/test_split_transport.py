"""Split runtime II: the gRPC transport and the entry points on loopback -- lossless over real
sockets with WAN emulation, malformed messages, a killed edge, a killed or frozen server, and an
end-to-end run of ``runtime.split_server`` + ``runtime.edge``."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest
from test_split_runtime import tiny

from runtime.engines import generate_ad
from runtime.split.batcher import VerificationBatcher
from runtime.split.edge_client import EdgeClient
from runtime.split.grpc_server import start_server
from runtime.split.messages import METHOD, VerdictMsg, VerifyMsg
from runtime.split.transport import DelayedLink, GrpcLink
from runtime.split.verifier import BatchVerifier, VerifyRequest

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


@pytest.fixture()
def served():
    """A verification server on loopback (port 0) around a float64 tiny target; stopped after."""
    target = tiny(2, 32, seed=0)
    batcher = VerificationBatcher(BatchVerifier(target, max_depth=8), cohorts=2, window_s=0.002)
    server, port, service = start_server(batcher, "127.0.0.1:0")
    yield target, batcher, f"127.0.0.1:{port}"
    server.stop(grace=1.0).wait(5)
    batcher.stop()


def wait_until(cond, seconds=20.0):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def test_grpc_split_is_lossless_with_wan_emulation(served):
    target, batcher, addr = served
    draft = tiny(1, 16, seed=1)
    jobs = [[[1, 2, 3], [9]], [[4, 5, 6, 7, 8]], [[10, 11]]]
    results = {}

    def client(i):
        edge = EdgeClient(draft, DelayedLink(GrpcLink(addr), rtt_ms=4, jitter_ms=2, bandwidth_mbps=10, seed=i), depth=3, proactive=i != 1)
        results[i] = [edge.generate(p, 12) for p in jobs[i]]
        edge.link.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(jobs))]
    [t.start() for t in threads]
    [t.join(60) for t in threads]
    for i, prompts in enumerate(jobs):
        assert [o.tokens for o in results[i]] == generate_ad(target, prompts, 12).tokens
        assert all(log.network_ms >= 4.0 for o in results[i] for log in o.iterations)  # the shim's RTT is a floor
    assert wait_until(lambda: batcher.members == 0 and not batcher.verifier.sessions)


def raw_stream(addr, payloads):
    """Send raw byte payloads on one stream; returns (replies, status code)."""
    with grpc.insecure_channel(addr) as channel:
        call = channel.stream_stream(METHOD, request_serializer=lambda b: b, response_deserializer=VerdictMsg.FromString)(iter(payloads))
        replies = []
        try:
            for r in call:
                replies.append(r)
        except grpc.RpcError as err:
            return replies, err.code(), err.details()
        return replies, grpc.StatusCode.OK, ""


@pytest.mark.parametrize("payloads,why", [
    ([b"\xff\xff\xff"], "not a VerifyMsg"),
    ([VerifyMsg(prompt=[1, 2], drafts=[99], committed=2).SerializeToString()], "token ids"),
    ([VerifyMsg(drafts=[1], committed=3).SerializeToString()], "no open request"),
    ([VerifyMsg(prompt=[1, 2], drafts=[1], committed=2).SerializeToString(), VerifyMsg(drafts=[1], committed=77).SerializeToString()], "committed"),
    ([VerifyMsg(prompt=[1], drafts=[1] * 9, committed=1).SerializeToString()], "at most 8"),
])
def test_malformed_message_gets_invalid_argument_and_the_server_keeps_serving(served, payloads, why):
    target, batcher, addr = served
    replies, code, details = raw_stream(addr, payloads)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and why in details
    assert len(replies) == len(payloads) - 1  # everything before the bad message was answered
    link = GrpcLink(addr)
    reply = link.submit(VerifyRequest("", (5,), (1, 2, 3), 3)).result(timeout=30)
    assert reply.committed == 3 + reply.accepted + 1
    link.close()
    assert wait_until(lambda: batcher.members == 0 and not batcher.verifier.sessions)


def test_killed_edge_frees_its_server_state(served):
    _, batcher, addr = served
    code = ("import sys, time\nfrom runtime.split.transport import GrpcLink\nfrom runtime.split.verifier import VerifyRequest\n"
            f"link = GrpcLink({addr!r})\nlink.submit(VerifyRequest('', (1, 2), (3, 4, 5), 3)).result(timeout=30)\n"
            "print('verified', flush=True)\ntime.sleep(600)\n")
    edge = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=ENV, stdout=subprocess.PIPE, text=True)
    try:
        assert edge.stdout.readline().strip() == "verified"
        assert batcher.members == 1 and len(batcher.verifier.sessions) == 1
        edge.send_signal(signal.SIGKILL)
        assert wait_until(lambda: batcher.members == 0 and not batcher.verifier.sessions)
    finally:
        edge.kill()
        edge.wait()


def start_server_process(*extra, tiny_pair=True):
    cmd = [sys.executable, "-m", "runtime.split_server", "--port", "0", *(["--preset", "tiny"] if tiny_pair else []), *extra]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = ""
    while "listening on" not in line:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            raise RuntimeError("the split server did not start")
    return proc, line.split("listening on ")[1].strip()


@pytest.mark.parametrize("how", ["kill", pytest.param("freeze", marks=pytest.mark.slow)])
def test_a_dead_server_ends_every_edge_request_with_an_outcome(pair, how):
    server, addr = start_server_process()
    try:
        outcomes = []

        def client(i):
            link = DelayedLink(GrpcLink(addr), rtt_ms=300)  # requests stay in flight long enough to be cut off
            edge = EdgeClient(pair.draft, link, depth=2, reply_timeout_s=3.0)
            outcomes.append(edge.generate(pair.tokenizer.encode("def f(x):"), 200))

        threads = [threading.Thread(target=client, args=(i,)) for i in range(3)]
        [t.start() for t in threads]
        time.sleep(1.0)
        server.send_signal(signal.SIGKILL if how == "kill" else signal.SIGSTOP)
        [t.join(60) for t in threads]
        assert not any(t.is_alive() for t in threads)
        expected = {"kill": {"error"}, "freeze": {"timeout"}}[how]
        assert len(outcomes) == 3 and {o.outcome for o in outcomes} == expected, [(o.outcome, o.error) for o in outcomes]
    finally:
        server.kill()
        server.wait()


def test_edge_and_server_processes_end_to_end(pair, tmp_path):
    server, addr = start_server_process("--idle-exit-s", "1", "--stats-out", str(tmp_path / "server.json"), "--cohorts", "2")
    try:
        edge = subprocess.run([sys.executable, "-m", "runtime.edge", "--preset", "tiny", "--server", addr, "--clients", "3", "--requests", "2",
                               "--max-new-tokens", "16", "--rtt-ms", "5", "--jitter-ms", "1", "--bandwidth-mbps", "50", "--proactive", "on",
                               "--depth", "auto", "--log", str(tmp_path / "log.jsonl"), "--summary", str(tmp_path / "summary.json")],
                              cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
        assert edge.returncode == 0, edge.stderr[-2000:]
        assert server.wait(timeout=60) == 0  # stopped by itself once the edge left
    finally:
        server.kill()
    summary = json.loads((tmp_path / "summary.json").read_text())
    stats = json.loads((tmp_path / "server.json").read_text())
    assert summary["outcomes"] == {"length": 6} and summary["tokens"] == 96
    assert stats["streams"] == 3 and stats["tokens"] == 96 and stats["rows"] == summary["iterations"]
    logs = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert len(logs) == summary["iterations"]
    assert {"sent_at", "arrived_at", "server_compute_ms", "queue_wait_ms", "accepted", "proactive_hit"} <= set(logs[0])
    from runtime.pair import CODE_PROMPTS, PROSE_PROMPTS

    prompts = [pair.tokenizer.encode(p) for p in CODE_PROMPTS + PROSE_PROMPTS]
    for req in summary["requests_detail"]:
        client, k = map(int, req["request_id"][1:].split("r"))
        prompt = prompts[(client * 2 + k) % len(prompts)]
        assert req["output_ids"] == generate_ad(pair.target, [prompt], 16).tokens[0], req["request_id"]


@pytest.mark.parametrize("args", [["--clients", "0"], ["--depth", "x"], ["--depth", "99"], ["--bandwidth-mbps", "0"], ["--rtt-ms", "-1"]])
def test_bad_edge_arguments_fail_fast(args):
    from runtime.edge import parse_args

    with pytest.raises(SystemExit) as exc:
        parse_args(["--server", "127.0.0.1:1", *args])
    assert args[0] in str(exc.value)


def test_transport_timing_measures_both_links():
    from runtime.split.transport_timing import measure

    rows = measure(requests=10, depth=3)
    assert [r["link"] for r in rows] == ["in-process", "grpc"]
    assert all(r["median_ms"] > 0 and r["cpu_ms_per_round_trip"] >= 0 and r["requests"] == 10 for r in rows)
