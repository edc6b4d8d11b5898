"""Live scheduling server: OpenAI-style completions with deadlines, planned by any scheduler.

    python -m runtime.serve scheduler=balance port=8011
    python -m runtime.serve scheduler=policy policy_path=policies/paper_k50 window_s=1.0

``POST /v1/completions`` takes ``prompt``, ``max_tokens``, ``stream`` (OpenAI's fields) and
``deadline_s`` (seconds from arrival; SpecSched's extension). Requests are collected into rounds
(``window_s``); each round is planned by the scheduler from the requests' prompt length,
``max_tokens`` (the output-length prediction), remaining deadline and the current acceptance
estimate, on the cost model of the server's measured profile. Rejected requests are answered at
once; the AD and SD batches then run on the engines with compute shares ``z`` / ``1 - z`` by
weighted time-slicing (the batch that has used less than its share of the device steps next; a
batch that ends leaves the device to the other). A request is answered as soon as its own last
token is out. Every request ends with exactly one outcome: ``served`` (on time), ``late`` or
``rejected`` (with a reason). ``GET /metrics`` reports counts, latency percentiles and throughput.

**Two devices** (``devices=[cuda:0,cuda:1]``, or ``[cpu,cpu]``): the AD batch runs on the first
(its own copy of the target), the SD batch on the second (target + draft), at the same time, each
with the whole device. The plan is still made for one shared device (the env models one device):
every batch then has at least the share it was planned with, so a plan that meets its deadlines on
one device meets them on two -- conservative, it admits no more users than one device would. On
CPU the two "devices" split the cores (``torch`` threads = cores / 2 each, unless ``threads`` is set).

**CPU threads.** On a small CPU the HTTP stack (and a load generator on the same machine) compete
with torch's OpenMP threads, which makes pass times jumpy; ``threads=1`` with the one-thread
profile (``profile=cpu1_specsched-pair``) trades speed for steady, predictable timings.

Listens on loopback by default; bad requests get a 4xx with a message and the server keeps
serving; on shutdown queued requests are rejected and the running round is finished.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from fastapi import Request as HTTPRequest  # module level: FastAPI resolves annotations by name

from agents.registry import make_scheduler
from envs.config import EnvConfig
from envs.feasibility import CostModel
from envs.plan import AD, SD
from envs.profile import load_profile
from envs.workload import Round
from runtime.engines import ad_steps, drain, sd_steps
from runtime.pair import ModelPair, build_pair, load_pair


@dataclass
class ServeConfig:
    scheduler: str = "balance"
    host: str = "127.0.0.1"
    port: int = 8011
    pair: str | None = None  #: a built pair folder; None = the project's own (built and cached)
    pair_preset: str = "full"
    device: str = "cpu"
    devices: list[str] | None = None  #: two devices: AD batches on the first, SD on the second (overrides ``device``)
    dtype: str = "float32"
    threads: int | None = None  #: torch CPU threads (None = torch's default); plan with a profile measured at the same count
    profile: str = "cpu_specsched-pair"  #: the cost model the scheduler plans with
    window_s: float = 0.5  #: how long a round collects requests
    max_round: int = 64  #: most requests in one round
    max_queue: int = 512  #: requests waiting beyond this are refused (503)
    stream_interval_s: float = 0.05  #: a stream sends new tokens at most this often (the first at once): per-token events cost CPU the model needs
    max_tokens_limit: int = 512
    max_prompt_tokens: int = 2048
    default_deadline_s: float = 30.0
    gamma: int = 4
    alpha_init: float = 0.8  #: acceptance estimate before any SD has run (then an EMA of measurements)
    policy_path: str | None = None
    shutdown_timeout_s: float = 30.0

    def validate(self) -> ServeConfig:
        def need(ok: bool, name: str, allowed: str) -> None:
            if not ok:
                raise ValueError(f"serve config '{name}' must be {allowed}, got {getattr(self, name)!r}")

        need(isinstance(self.port, int) and 0 <= self.port <= 65535, "port", "an integer in [0, 65535]")
        need(self.window_s > 0, "window_s", "> 0")
        need(self.stream_interval_s >= 0, "stream_interval_s", ">= 0")
        need(self.threads is None or (isinstance(self.threads, int) and self.threads >= 1), "threads", "null or an integer >= 1")
        need(isinstance(self.max_round, int) and self.max_round >= 1, "max_round", "an integer >= 1")
        need(isinstance(self.max_tokens_limit, int) and self.max_tokens_limit >= 1, "max_tokens_limit", "an integer >= 1")
        need(isinstance(self.max_prompt_tokens, int) and self.max_prompt_tokens >= 1, "max_prompt_tokens", "an integer >= 1")
        need(self.default_deadline_s > 0, "default_deadline_s", "> 0")
        need(isinstance(self.gamma, int) and 1 <= self.gamma <= 8, "gamma", "an integer in [1, 8]")
        need(0 < self.alpha_init < 1, "alpha_init", "in (0, 1)")
        need(self.devices is None or (isinstance(self.devices, list | tuple) and len(self.devices) == 2 and all(isinstance(d, str) and d for d in self.devices)),
             "devices", "null or a list of two device names, e.g. [cuda:0, cuda:1]")
        return self


class RequestError(ValueError):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass
class Request:
    id: str
    prompt_ids: list[int]
    max_tokens: int
    deadline_s: float
    arrival: float = field(default_factory=time.monotonic)
    tokens: list[int] = field(default_factory=list)
    unsent: list[int] = field(default_factory=list)  #: generated, not yet handed to the event loop
    last_sent: float = 0.0
    first_token_at: float | None = None
    mode: str = "-"
    alpha_planned: float | None = None  #: the acceptance estimate the round was planned with
    sd_iterations: int | None = None
    sd_accepted: int | None = None
    sd_rejections: int | None = None
    completed_at: float | None = None  #: monotonic time of the last token (or of the decision)
    round_start: float | None = None  #: monotonic time its round began planning
    planned_at: float | None = None  #: monotonic time its round's plan was made
    outcome: str | None = None  #: served, late or rejected
    reason: str = ""
    queue: asyncio.Queue | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)


def parse_request(body: bytes, cfg: ServeConfig, encode) -> tuple[list[int], int, float, bool]:
    """Validate a completion request; raises :class:`RequestError` with the field and the limit."""
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise RequestError(400, "request body is not valid JSON") from None
    if not isinstance(data, dict):
        raise RequestError(400, "request body must be a JSON object")
    prompt = data.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise RequestError(400, "'prompt' is required and must be a non-empty string")
    max_tokens = data.get("max_tokens", 16)
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or not 1 <= max_tokens <= cfg.max_tokens_limit:
        raise RequestError(400, f"'max_tokens' must be an integer in [1, {cfg.max_tokens_limit}], got {max_tokens!r}")
    deadline = data.get("deadline_s", cfg.default_deadline_s)
    if not isinstance(deadline, int | float) or isinstance(deadline, bool) or not np.isfinite(deadline) or deadline <= 0:
        raise RequestError(400, f"'deadline_s' must be a number > 0 (seconds from arrival), got {deadline!r}")
    stream = data.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError(400, f"'stream' must be true or false, got {stream!r}")
    ids = encode(prompt)
    if len(ids) > cfg.max_prompt_tokens:
        raise RequestError(413, f"prompt has {len(ids)} tokens; the limit is {cfg.max_prompt_tokens}")
    if not ids:
        raise RequestError(400, "'prompt' encodes to no tokens")
    return ids, max_tokens, float(deadline), stream


def run_shared(jobs: dict[str, tuple[Any, float]], after_step: Callable[[], None] | None = None) -> dict[str, Any]:
    """Step several engine generators on one device with compute shares by weighted time-slicing.

    ``jobs`` maps a name to ``(generator, share)``; the job with the least ``used time / share``
    steps next, so over any stretch each gets its share of the device; ``after_step`` runs after
    every step (outside the timed part). Returns each job's result.
    """
    used = dict.fromkeys(jobs, 0.0)
    results: dict[str, Any] = {}
    live = dict(jobs)
    while live:
        name = min(live, key=lambda n: used[n] / max(live[n][1], 1e-9))
        gen = live[name][0]
        start = time.perf_counter()
        try:
            next(gen)
        except StopIteration as stop:
            results[name] = stop.value
            del live[name]
        used[name] += time.perf_counter() - start
        if after_step is not None:
            after_step()
    return results


def run_parallel(jobs: dict[str, Any], after_step: Callable[[], None] | None = None) -> dict[str, Any]:
    """Run engine generators at the same time, one thread each (one device each)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        futures = {name: pool.submit(drain, gen, after_step) for name, gen in jobs.items()}
        return {name: f.result() for name, f in futures.items()}


class _Outbox:
    """What a round's engine threads hand to the event loop: streamed text and finished requests,
    at most one wake-up of the loop per engine step (not one per token) and, per stream, a send at
    most every ``interval_s`` (the first at once)."""

    def __init__(self, server: RoundServer, loop, decode: Callable[[list[int]], str]):
        self.server, self.loop, self.decode = server, loop, decode
        self.lock = threading.Lock()  # two devices: two engine threads at once
        self.pending: dict[str, Request] = {}  # requests with news for the event loop

    def tokens(self, r: Request, new: list[int]) -> None:
        with self.lock:
            r.tokens.extend(new)
            if r.queue is not None:
                r.unsent.extend(new)
                self.pending[r.id] = r

    def complete(self, r: Request) -> None:
        """The request's last token is out."""
        with self.lock:
            if r.completed_at is None:
                r.completed_at = time.monotonic()
                self.server.metrics["tokens"] += len(r.tokens)
                self.pending[r.id] = r

    def flush(self, force: bool = False) -> None:
        now = time.monotonic()
        interval = self.server.cfg.stream_interval_s
        texts, ends = [], []
        with self.lock:
            for r in list(self.pending.values()):
                done = r.completed_at is not None
                if r.unsent and (force or done or not r.last_sent or now - r.last_sent >= interval):
                    texts.append((r.queue, self.decode(r.unsent)))
                    r.unsent, r.last_sent = [], now
                if done:
                    ends.append(r)
                if done or not r.unsent:
                    del self.pending[r.id]
        if texts or ends:
            self.loop.call_soon_threadsafe(self.server.deliver, texts, ends)


class RoundServer:
    """Rounds of requests, planned by a scheduler and run on a model pair."""

    def __init__(self, cfg: ServeConfig, pair: ModelPair):
        self.cfg = cfg.validate()
        self.pair = pair
        # with two devices the SD pair lives on the second and AD gets its own target on the first
        self.ad_target = pair.target
        if cfg.devices:
            import copy

            self.ad_target = copy.deepcopy(pair.target).to(cfg.devices[0])
            pair.target.to(cfg.devices[1])
            pair.draft.to(cfg.devices[1])
        profile = load_profile(cfg.profile)
        self.cost = CostModel(profile)
        # lengths and deadlines of live requests are not bounded by a workload config: wide ranges
        self.env_cfg = EnvConfig(num_users=1, profile=cfg.profile, input_tokens=[1, 1 << 20], output_tokens=[1, 1 << 20], deadline_s=[1e-6, 1e6], max_users=64)
        self.scheduler = make_scheduler(cfg.scheduler, self.cost, self.env_cfg, gamma=cfg.gamma, seed=0, policy_path=cfg.policy_path)
        self.alpha = cfg.alpha_init
        self.pending: list[Request] = []
        self.wakeup = asyncio.Event()
        self.closing = False
        self.lock = threading.Lock()  # one round on the device at a time
        self.metrics: dict[str, Any] = {"requests": 0, "served": 0, "late": 0, "rejected": 0, "rejected_reasons": {}, "rounds": 0, "tokens": 0, "bad_requests": 0}
        self.latencies: list[float] = []
        self.started = time.monotonic()

    # ----------------------------------------------------------------------------- requests
    def submit(self, req: Request) -> None:
        if self.closing:
            raise RequestError(503, "server is shutting down")
        if len(self.pending) >= self.cfg.max_queue:
            raise RequestError(503, f"too many queued requests (max_queue={self.cfg.max_queue})")
        self.metrics["requests"] += 1
        self.pending.append(req)
        self.wakeup.set()

    def finish(self, req: Request, outcome: str, reason: str = "") -> None:
        req.outcome, req.reason = outcome, reason
        self.metrics[outcome] += 1
        if outcome == "rejected":
            self.metrics["rejected_reasons"][reason] = self.metrics["rejected_reasons"].get(reason, 0) + 1
        else:
            self.latencies.append((req.completed_at or time.monotonic()) - req.arrival)
        if req.queue is not None:
            req.queue.put_nowait(None)
        req.done.set()

    # ----------------------------------------------------------------------------- rounds
    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self.closing:
            await self.wakeup.wait()
            self.wakeup.clear()
            if self.closing:
                break
            await asyncio.sleep(self.cfg.window_s)
            batch, self.pending = self.pending[: self.cfg.max_round], self.pending[self.cfg.max_round :]
            if self.pending:
                self.wakeup.set()
            if batch:
                await loop.run_in_executor(None, self.run_round, batch, loop)

    def _round(self, batch: list[Request]) -> Round:
        now = time.monotonic()
        n = len(batch)
        return Round.from_arrays(
            self.env_cfg,
            input_tokens=[len(r.prompt_ids) for r in batch],
            output_tokens=[r.max_tokens for r in batch],
            deadline_s=[max(r.deadline_s - (now - r.arrival), 1e-6) for r in batch],
            alpha=np.full(n, self.alpha),
            distance_m=np.full(n, self.env_cfg.min_distance_m),  # loopback: the shortest link
        )

    def run_round(self, batch: list[Request], loop) -> None:
        with self.lock:
            self.metrics["rounds"] += 1
            began = time.monotonic()
            plan = self.scheduler.plan(self._round(batch))
            decided = time.monotonic()
            for r, m in zip(batch, plan.modes, strict=True):
                r.alpha_planned = self.alpha
                r.round_start, r.planned_at = began, decided
                if m not in (AD, SD):
                    r.completed_at = decided
                    loop.call_soon_threadsafe(self.finish, r, "rejected", "admission: the plan cannot meet this deadline")
            tok = self.pair.tokenizer
            outbox = _Outbox(self, loop, tok.decode)
            jobs, groups = {}, {}
            for mode, share in ((AD, plan.z), (SD, 1.0 - plan.z)):
                members = [r for r, m in zip(batch, plan.modes, strict=True) if m == mode]
                if not members:
                    continue
                name = "ad" if mode == AD else "sd"
                groups[name] = members
                for r in members:
                    r.mode = name
                    if mode == SD:
                        r.sd_iterations = r.sd_accepted = r.sd_rejections = 0

                def stream(row, new, members=members, sd=mode == SD):
                    r = members[row]
                    if r.first_token_at is None:
                        r.first_token_at = time.monotonic()
                    outbox.tokens(r, new)
                    last = len(r.tokens) >= r.max_tokens or new[-1] == tok.eos_id
                    if sd:  # one call per SD iteration; the last one may be cut short, so it is not counted as acceptance
                        r.sd_iterations += 1
                        if not last:
                            r.sd_accepted += len(new) - 1
                            r.sd_rejections += int(len(new) - 1 < plan.gamma)
                    if last:
                        outbox.complete(r)

                common = dict(max_new_tokens=[r.max_tokens for r in members], eos_id=tok.eos_id, pad_id=tok.pad_id, on_tokens=stream)
                prompts = [r.prompt_ids for r in members]
                if mode == AD:
                    gen = ad_steps(self.ad_target, prompts, **common)
                else:
                    gen = sd_steps(self.pair.target, self.pair.draft, prompts, plan.gamma, **common)
                jobs[name] = (gen, max(share, 1e-6))
            if self.cfg.devices and len(jobs) > 1:
                results = run_parallel({name: gen for name, (gen, _) in jobs.items()}, outbox.flush)
            else:
                results = run_shared(jobs, outbox.flush)
            if "sd" in results and np.isfinite(results["sd"].alpha_hat):
                self.alpha = float(np.clip(0.7 * self.alpha + 0.3 * results["sd"].alpha_hat, 0.05, 0.99))
            for members in groups.values():
                for r in members:
                    outbox.complete(r)  # a row that ended without reaching its limit or EOS (none expected)
            outbox.flush(force=True)

    def deliver(self, texts: list, ends: list[Request]) -> None:
        """Event loop: hand streamed text to the waiting responses, then end finished requests."""
        for queue, text in texts:
            queue.put_nowait(text)
        for r in ends:
            on_time = r.completed_at - r.arrival <= r.deadline_s
            self.finish(r, "served" if on_time else "late", "" if on_time else "deadline missed")

    async def shutdown(self) -> None:
        self.closing = True
        self.wakeup.set()
        for r in self.pending:
            self.finish(r, "rejected", "server shutting down")
        self.pending = []
        # let the round on the device finish
        deadline = time.monotonic() + self.cfg.shutdown_timeout_s
        while self.lock.locked() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    def snapshot(self) -> dict[str, Any]:
        lat = np.asarray(self.latencies) if self.latencies else np.zeros(0)
        up = time.monotonic() - self.started
        return {
            **self.metrics,
            "scheduler": self.cfg.scheduler,
            "queued": len(self.pending),
            "alpha_estimate": self.alpha,
            "latency_p50_s": float(np.percentile(lat, 50)) if lat.size else None,
            "latency_p99_s": float(np.percentile(lat, 99)) if lat.size else None,
            "tokens_per_s": self.metrics["tokens"] / up if up > 0 else 0.0,
            "uptime_s": up,
        }


def create_app(cfg: ServeConfig, pair: ModelPair | None = None):
    """The FastAPI app (the model pair is loaded here unless given)."""
    from contextlib import asynccontextmanager

    from fastapi import FastAPI
    from fastapi.responses import JSONResponse, StreamingResponse

    cfg.validate()
    if pair is None:
        pair = load_pair(cfg.pair or build_pair(recipe=cfg.pair_preset), device=cfg.devices[1] if cfg.devices else cfg.device, dtype=cfg.dtype)
    server_box: dict[str, RoundServer] = {}

    @asynccontextmanager
    async def lifespan(app):
        server = server_box["s"] = RoundServer(cfg, pair)
        task = asyncio.create_task(server.run())
        yield
        await server.shutdown()
        task.cancel()

    app = FastAPI(title="SpecSched", lifespan=lifespan)

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": {"message": message, "type": "invalid_request_error" if status < 500 else "server_error"}}, status_code=status)

    @app.post("/v1/completions")
    async def completions(request: HTTPRequest):
        server = server_box["s"]
        try:
            ids, max_tokens, deadline, stream = parse_request(await request.body(), cfg, pair.tokenizer.encode)
            req = Request(id=f"cmpl-{uuid.uuid4().hex[:16]}", prompt_ids=ids, max_tokens=max_tokens, deadline_s=deadline, queue=asyncio.Queue() if stream else None)
            server.submit(req)
        except RequestError as err:
            server.metrics["bad_requests"] += int(err.status < 500)
            return error(err.status, str(err))
        created = int(time.time())

        def chunk(text: str, finish: str | None, extra: dict | None = None) -> dict:
            body = {"id": req.id, "object": "text_completion", "created": created, "model": "specsched", "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": None}]}
            if extra:
                body["specsched"] = extra
            return body

        def summary() -> dict:
            return {"outcome": req.outcome, "reason": req.reason, "mode": req.mode, "latency_s": (req.completed_at or time.monotonic()) - req.arrival,
                    "ttft_s": (req.first_token_at - req.arrival) if req.first_token_at else None, "completion_tokens": len(req.tokens),
                    "wait_s": (req.round_start - req.arrival) if req.round_start else None, "plan_s": (req.planned_at - req.round_start) if req.round_start else None,
                    "alpha_planned": req.alpha_planned, "sd_iterations": req.sd_iterations, "sd_accepted": req.sd_accepted, "sd_rejections": req.sd_rejections}

        if not stream:
            await req.done.wait()
            body = chunk(pair.tokenizer.decode(req.tokens), "length" if req.outcome != "rejected" else "rejected", summary())
            body["usage"] = {"prompt_tokens": len(ids), "completion_tokens": len(req.tokens), "total_tokens": len(ids) + len(req.tokens)}
            return JSONResponse(body)

        async def events():
            while True:
                piece = await req.queue.get()
                if piece is None:
                    break
                yield f"data: {json.dumps(chunk(piece, None))}\n\n"
            await req.done.wait()
            yield f"data: {json.dumps(chunk('', 'length' if req.outcome != 'rejected' else 'rejected', summary()))}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.get("/metrics")
    async def metrics():
        return server_box["s"].snapshot()

    return app


def main() -> None:
    import hydra
    from omegaconf import OmegaConf

    @hydra.main(version_base="1.3", config_path="../conf", config_name="serve")
    def app(raw) -> None:
        import uvicorn

        values = OmegaConf.to_container(raw, resolve=True)
        if isinstance(values.get("profile"), dict):  # the profile group's data: the server loads it by name
            values["profile"] = values["profile"]["name"]
        known = set(ServeConfig.__dataclass_fields__)
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown serve config key(s) {unknown}; known: {sorted(known)}")
        cfg = ServeConfig(**values).validate()
        if cfg.host not in ("127.0.0.1", "localhost", "::1"):
            print(f"warning: listening on {cfg.host}, not loopback")
        import torch

        if cfg.threads is not None:
            torch.set_num_threads(cfg.threads)
        elif cfg.devices and all(d == "cpu" for d in cfg.devices):
            import os

            torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))  # the two "devices" split the cores
        uvicorn.run(create_app(cfg), host=cfg.host, port=cfg.port, log_level="info")

    app()


if __name__ == "__main__":
    main()
