"""Time the server's verification forward (:meth:`BatchVerifier.verify`) at the shapes a split run
produces, to tell what a verification batch costs on a device and whether new shapes are the cost.

    python -m runtime.split.verify_timing --pair PATH --device cuda --dtype float16 --out DIR

For each setting of cuDNN attention (``--cudnn-attention``), batch size ``B`` and shape bucket (``1``: every past length is its own shape; ``64``:
past widths rounded up to multiples of 64, as the verifier does on CUDA) it runs three schedules
of ``verify`` calls, each row carrying ``depth`` drafts over a past of synthetic KV:

- ``repeat``: the same past length every call (one shape; the steady-state cost);
- ``growing``: past lengths growing by ``step`` tokens per call, as a client's text grows (a new
  shape at every call with bucket 1, a new one every ``64 / step`` calls with bucket 64);
- ``revisit``: the growing schedule again (every shape already seen once).

``growing`` minus ``revisit`` is what first-seen shapes cost (autotuning, kernel selection,
allocator growth); ``revisit`` minus ``repeat`` is what longer pasts and re-stacking cost.
**Against the SD engine** (``--vs-engine``): where the split server's CPU goes per emitted token,
next to server-only SD's (:func:`runtime.engines.sd_steps`) at the same batch and depth, in one
process on one thread (CPU time, ``time.thread_time``): for each ``(B, depth)`` the engine serves
``B`` prompts with ``gamma = depth``, and the split's verifier serves the same prompts with the
same draft model drafting ``depth`` per row in-process (no network: the draft's time is the edge's
and is not counted). Target forwards are timed by forward hooks, so each side's time splits into
target prefill + verification forwards, draft forwards (engine only) and the rest (the engine's
bookkeeping; the verifier's KV gathering, masks, sampling). Writes ``DIR/verify_vs_engine.csv``
and ``.md``.

Writes ``DIR/verify_timing.csv`` (one row per call: schedule, bucket, batch, past, ms),
``DIR/verify_timing.json`` and ``DIR/verify_timing.md`` (medians and means per schedule). Times are wall-clock milliseconds
per ``verify`` call (it synchronises on CUDA), stacking and splitting the KV included.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
import torch

from agents.artefacts import write_csv_atomic, write_text_atomic
from runtime.split.pair_args import add_pair_args, load_pair_from_args
from runtime.split.verifier import BatchVerifier, Session, VerifyRequest

if TYPE_CHECKING:
    from runtime.pair import ModelPair

SCHEDULES = ("repeat", "growing", "revisit")


def _fake_kv(config, length: int, device, dtype) -> tuple:
    """A client's KV of ``length`` tokens (random: timing only), per layer ``(1, kv_heads, length, head_dim)``."""
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
    shape = (1, int(config.num_key_value_heads), length, head_dim)
    return tuple((torch.randn(shape, device=device, dtype=dtype), torch.randn(shape, device=device, dtype=dtype))
                 for _ in range(int(config.num_hidden_layers)))


def time_calls(verifier: BatchVerifier, batch: int, pasts: list[int], depth: int, seed: int = 0) -> list[float]:
    """Milliseconds of one ``verify`` per entry of ``pasts`` (row ``i``'s past: ``pasts[k] + 3 i``)."""
    target = verifier.target
    param = next(target.parameters())
    gen = torch.Generator().manual_seed(seed)
    vocab = int(target.config.vocab_size)
    times = []
    for past in pasts:
        reqs = []
        for row in range(batch):
            client, n = f"c{row}", past + 3 * row  # rows of one batch differ in length, as real clients do
            verifier.sessions[client] = Session(_fake_kv(target.config, n, param.device, param.dtype), 1, n + 1, 0.0,
                                                torch.Generator(device=param.device).manual_seed(row))
            drafts = tuple(torch.randint(0, vocab, (depth,), generator=gen).tolist())
            reqs.append(VerifyRequest(client, drafts, (), n + 1))
        if param.device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        verifier.verify(reqs)
        times.append(1e3 * (time.perf_counter() - t0))
    return times


def run(target: torch.nn.Module, batches: list[int], buckets: list[int], depth: int, start: int, stop: int, step: int, repeats: int,
        cudnn: tuple[bool, ...] = (False,)) -> pd.DataFrame:
    """Every (cuDNN attention on/off, bucket, batch) in turn; with cuDNN on, the growing schedule
    starts ``step / 2`` later, so its shapes are new to it too (no plan left from the other setting)."""
    rows = []
    for use_cudnn in cudnn:
        first = start + (step // 2 if use_cudnn and len(cudnn) > 1 else 0)
        growing = list(range(first, stop, step))
        for bucket in buckets:
            for batch in batches:
                verifier = BatchVerifier(target, max_depth=max(depth, 1), bucket=bucket, cudnn_attention=use_cudnn)
                time_calls(verifier, batch, [first] * 3, depth)  # warm-up at the first shape
                schedules = {"repeat": [first] * repeats, "growing": growing, "revisit": growing}
                for name in SCHEDULES:
                    for past, ms in zip(schedules[name], time_calls(verifier, batch, schedules[name], depth), strict=True):
                        rows.append({"cudnn_attention": use_cudnn, "schedule": name, "bucket": bucket, "batch": batch, "past": past, "ms": ms})
    return pd.DataFrame(rows)


def summarise(df: pd.DataFrame) -> list[dict]:
    out = []
    for (cudnn, bucket, batch, schedule), g in df.groupby(["cudnn_attention", "bucket", "batch", "schedule"], sort=True):
        ms = g.ms.tolist()
        out.append({"cudnn_attention": bool(cudnn), "bucket": int(bucket), "batch": int(batch), "schedule": schedule, "calls": len(ms), "median_ms": statistics.median(ms),
                    "mean_ms": statistics.fmean(ms), "max_ms": max(ms)})
    return out


class _ForwardClock:
    """Thread CPU seconds spent inside a module's forwards (hooks; no nesting across modules)."""

    def __init__(self, module):
        self.seconds, self.calls, self._t0 = 0.0, 0, 0.0
        self._hooks = [module.register_forward_pre_hook(self._pre), module.register_forward_hook(self._post)]

    def _pre(self, *_):
        self._t0 = time.thread_time()

    def _post(self, *_):
        self.seconds += time.thread_time() - self._t0
        self.calls += 1

    def remove(self) -> None:
        for h in self._hooks:
            h.remove()


def _split_in_process(target, draft, prompts: list[list[int]], depth: int, max_new: int) -> tuple[dict, int]:
    """The split's server CPU on ``prompts`` (drafts from ``draft`` in-process, not counted)."""
    from runtime.split.drafter import DraftSession

    verifier = BatchVerifier(target, max_depth=max(depth, 1))
    sessions = [DraftSession(draft, p) for p in prompts]
    emitted = [0] * len(prompts)
    clock, cpu, iterations = _ForwardClock(target), 0.0, 0
    try:
        first = True
        while True:
            live = [b for b in range(len(prompts)) if emitted[b] < max_new]
            if not live:
                break
            reqs = []
            for b in live:
                d = min(depth, max_new - emitted[b] - 1)
                drafts = sessions[b].propose(d) if d > 0 else []
                reqs.append(VerifyRequest(f"c{b:03d}", tuple(drafts), tuple(prompts[b]) if first else (), len(sessions[b].tokens)))
            c0 = time.thread_time()
            verdicts = verifier.verify(reqs)
            cpu += time.thread_time() - c0
            iterations += 1
            for b, r, v in zip(live, reqs, verdicts, strict=True):
                sessions[b].commit(len(r.drafts), v.accepted, v.bonus)
                emitted[b] += v.accepted + 1
            first = False
    finally:
        clock.remove()
    tokens = sum(min(e, max_new) for e in emitted)
    return {"cpu_s": cpu, "target_s": clock.seconds, "draft_s": 0.0, "target_calls": clock.calls, "iterations": iterations,
            "kv_reused": verifier.timing["reused"], "kv_stacked": verifier.timing["stacked"]}, tokens


def _engine(target, draft, prompts: list[list[int]], gamma: int, max_new: int) -> tuple[dict, int]:
    from runtime.engines import drain, sd_steps

    tclock, dclock = _ForwardClock(target), _ForwardClock(draft)
    try:
        c0 = time.thread_time()
        res = drain(sd_steps(target, draft, prompts, gamma, max_new))
        cpu = time.thread_time() - c0
    finally:
        tclock.remove()
        dclock.remove()
    return {"cpu_s": cpu, "target_s": tclock.seconds, "draft_s": dclock.seconds, "target_calls": tclock.calls,
            "iterations": max(res.iterations) if res.iterations else 0}, res.generated


def vs_engine(pair: ModelPair, batches: list[int], depths: list[int], max_new: int, repeats: int = 2) -> pd.DataFrame:
    """CPU milliseconds per emitted token, split verifier vs SD engine, per ``(B, depth)``; the two
    sides alternate ``repeats`` times (a shared machine's load drifts over both alike)."""
    from runtime.pair import CODE_PROMPTS, PROSE_PROMPTS

    all_prompts = [pair.tokenizer.encode(p) for p in CODE_PROMPTS + PROSE_PROMPTS]
    rows = []
    with torch.no_grad():
        for batch, depth in itertools.product(batches, depths):
            prompts = [all_prompts[i % len(all_prompts)] for i in range(batch)]
            for rep in range(repeats):
                for side, fn in (("engine", _engine), ("split", _split_in_process)):
                    m, tokens = fn(pair.target, pair.draft, prompts, depth, max_new)
                    rows.append({"side": side, "batch": batch, "depth": depth, "repeat": rep, "tokens": tokens,
                                 "cpu_ms_per_token": 1e3 * m["cpu_s"] / tokens, "target_ms_per_token": 1e3 * m["target_s"] / tokens,
                                 "draft_ms_per_token": 1e3 * m["draft_s"] / tokens,
                                 "rest_ms_per_token": 1e3 * (m["cpu_s"] - m["target_s"] - m["draft_s"]) / tokens,
                                 "target_forwards": m["target_calls"], "iterations": m["iterations"]})
                    print(f"[verify_timing] B={batch} depth={depth} {side}: {rows[-1]['cpu_ms_per_token']:.3f} ms CPU/token "
                          f"(target {rows[-1]['target_ms_per_token']:.3f}, draft {rows[-1]['draft_ms_per_token']:.3f}, rest {rows[-1]['rest_ms_per_token']:.3f})", flush=True)
    return pd.DataFrame(rows)


def vs_engine_table(df: pd.DataFrame) -> pd.DataFrame:
    """Medians over repeats, one row per (B, depth): both sides and the split/engine CPU ratio."""
    med = df.groupby(["batch", "depth", "side"], as_index=False).median(numeric_only=True)
    wide = med.pivot(index=["batch", "depth"], columns="side", values=["cpu_ms_per_token", "target_ms_per_token", "draft_ms_per_token",
                                                                      "rest_ms_per_token", "target_forwards"])
    wide.columns = [f"{side}_{name}" for name, side in wide.columns]
    wide = wide.reset_index()
    wide["engine_cpu_per_split_cpu"] = wide.engine_cpu_ms_per_token / wide.split_cpu_ms_per_token
    return wide[["batch", "depth", "engine_cpu_ms_per_token", "engine_target_ms_per_token", "engine_draft_ms_per_token", "engine_rest_ms_per_token",
                 "split_cpu_ms_per_token", "split_target_ms_per_token", "split_rest_ms_per_token", "engine_target_forwards", "split_target_forwards",
                 "engine_cpu_per_split_cpu"]]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pair_args(ap)
    ap.add_argument("--batches", default="1,4,8", help="rows per verification batch (comma list, each >= 1)")
    ap.add_argument("--buckets", default="1,64", help="shape buckets to compare (comma list, each >= 1)")
    ap.add_argument("--depth", type=int, default=8, help="drafts per row (>= 0)")
    ap.add_argument("--start", type=int, default=48, help="first past length, tokens (>= 1)")
    ap.add_argument("--stop", type=int, default=560, help="growing schedule stops below this past length")
    ap.add_argument("--step", type=int, default=8, help="past growth per call, tokens (>= 1)")
    ap.add_argument("--repeats", type=int, default=30, help="calls of the repeat schedule (>= 1)")
    ap.add_argument("--cudnn-attention", default="off", help="comma list of on/off: let attention use cuDNN's kernel (CUDA only)")
    ap.add_argument("--out", type=Path, required=True, help="folder for verify_timing.csv and verify_timing.json")
    ap.add_argument("--vs-engine", action="store_true", help="instead: CPU per emitted token, split verifier vs the SD engine (module docstring)")
    ap.add_argument("--depths", default="4,7", help="with --vs-engine: draft depths (comma list, each >= 1)")
    ap.add_argument("--max-new-tokens", type=int, default=64, help="with --vs-engine: tokens per prompt (>= 2)")
    ap.add_argument("--vs-repeats", type=int, default=2, help="with --vs-engine: alternations of the two sides (>= 1)")
    args = ap.parse_args(argv)
    if args.vs_engine:
        run_vs_engine(args)
        return
    try:
        batches = [int(x) for x in args.batches.split(",") if x]
        buckets = [int(x) for x in args.buckets.split(",") if x]
    except ValueError:
        raise SystemExit(f"--batches and --buckets take comma lists of integers, got {args.batches!r} and {args.buckets!r}") from None
    cudnn = tuple(x == "on" for x in args.cudnn_attention.split(",") if x)
    if not cudnn or not set(args.cudnn_attention.split(",")) <= {"on", "off"}:
        raise SystemExit(f"--cudnn-attention takes a comma list of on/off, got {args.cudnn_attention!r}")
    if not batches or min(batches) < 1 or not buckets or min(buckets) < 1:
        raise SystemExit("--batches and --buckets need integers >= 1")
    if args.depth < 0 or args.start < 1 or args.step < 1 or args.stop <= args.start or args.repeats < 1:
        raise SystemExit("--depth must be >= 0, --start and --step >= 1, --stop > --start and --repeats >= 1")
    pair = load_pair_from_args(args)
    t0 = time.perf_counter()
    df = run(pair.target, batches, buckets, args.depth, args.start, args.stop, args.step, args.repeats, cudnn)
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv_atomic(df, args.out / "verify_timing.csv", index=False)
    device = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else args.device
    summary = {"device": device, "dtype": args.dtype, "torch": torch.__version__, "depth": args.depth, "start": args.start, "stop": args.stop,
               "step": args.step, "wall_s": time.perf_counter() - t0, "summary": summarise(df)}
    write_text_atomic(args.out / "verify_timing.json", json.dumps(summary, indent=2))
    table = pd.DataFrame(summary["summary"]).to_markdown(index=False, floatfmt=".2f")
    write_text_atomic(args.out / "verify_timing.md", f"Device {device}, {args.dtype}, torch {torch.__version__}; depth {args.depth}, "
                      f"past {args.start}..{args.stop} step {args.step}.\n\n{table}\n")
    print(table, flush=True)


def run_vs_engine(args: argparse.Namespace) -> None:
    try:
        batches = [int(x) for x in args.batches.split(",") if x]
        depths = [int(x) for x in args.depths.split(",") if x]
    except ValueError:
        raise SystemExit(f"--batches and --depths take comma lists of integers, got {args.batches!r} and {args.depths!r}") from None
    if not batches or min(batches) < 1 or not depths or min(depths) < 1 or args.max_new_tokens < 2 or args.vs_repeats < 1:
        raise SystemExit("--batches and --depths need integers >= 1, --max-new-tokens >= 2 and --vs-repeats >= 1")
    pair = load_pair_from_args(args)
    t0 = time.perf_counter()
    load0 = os.getloadavg()[0]
    df = vs_engine(pair, batches, depths, args.max_new_tokens, args.vs_repeats)
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv_atomic(df, args.out / "verify_vs_engine.csv", index=False)
    table = vs_engine_table(df)
    cmd = "python -m runtime.split.verify_timing " + " ".join(argv_text(args))
    md = [f"Command: `{cmd}`", "",
          f"CPU milliseconds per emitted token on one thread ({args.device} {args.dtype}, {args.max_new_tokens} tokens per prompt, prompts of the "
          f"pair's lists; medians of {args.vs_repeats} alternations; host load average (1 min) {load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end; "
          f"{time.perf_counter() - t0:.0f} s). engine: server-only SD (draft gamma = depth, verify, on the server); split: the verifier alone "
          "(its edge drafts elsewhere); target = time inside target forwards (prefill included), rest = everything else on that side.", "",
          table.to_markdown(index=False, floatfmt=".3f"), ""]
    write_text_atomic(args.out / "verify_vs_engine.md", "\n".join(md))
    print("\n".join(md), flush=True)


def argv_text(args: argparse.Namespace) -> list[str]:
    return ["--vs-engine", "--batches", args.batches, "--depths", args.depths, "--max-new-tokens", str(args.max_new_tokens),
            "--vs-repeats", str(args.vs_repeats), "--out", str(args.out)]


if __name__ == "__main__":
    main()
