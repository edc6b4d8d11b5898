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
Writes ``DIR/verify_timing.csv`` (one row per call: schedule, bucket, batch, past, ms),
``DIR/verify_timing.json`` and ``DIR/verify_timing.md`` (medians and means per schedule). Times are wall-clock milliseconds
per ``verify`` call (it synchronises on CUDA), stacking and splitting the KV included.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import pandas as pd
import torch

from agents.artefacts import write_csv_atomic, write_text_atomic
from runtime.split.pair_args import add_pair_args, load_pair_from_args
from runtime.split.verifier import BatchVerifier, Session, VerifyRequest

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


def run(target, batches: list[int], buckets: list[int], depth: int, start: int, stop: int, step: int, repeats: int,
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
    args = ap.parse_args(argv)
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


if __name__ == "__main__":
    main()
