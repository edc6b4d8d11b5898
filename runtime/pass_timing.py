"""Timing primitives of the profilers: one forward pass, one padded prefill, the device's
measured peak, the model's architecture numbers. Shared by ``runtime.profile`` (both models on one
device, ``--role server``) and ``runtime.split.role_profile`` (the draft on the edge device), so
neither imports the other.
"""

from __future__ import annotations

import os
import time

import numpy as np
import torch


def sync_device(device: str | torch.device) -> None:
    """Wait for the device's queued work (a no-op on CPU), so wall-clock timings cover it."""
    if str(device).startswith("cuda"):
        # the device itself: without an argument synchronize() waits for the *current* device
        # (cuda:0), and a pass timed on cuda:1 would stop the clock before its kernels ran
        torch.cuda.synchronize(device)


def model_spec(model: torch.nn.Module, name: str) -> dict:
    """The architecture numbers a profile's ``llm`` / ``slm`` section records (counts; bytes per parameter)."""
    cfg = model.config
    heads = cfg.num_attention_heads
    return {
        "name": name,
        "params": int(sum(p.numel() for p in model.parameters())),
        "layers": int(cfg.num_hidden_layers),
        "hidden": int(cfg.hidden_size),
        "ffn_hidden": int(getattr(cfg, "intermediate_size", 4 * cfg.hidden_size)),
        "heads": int(heads),
        "kv_heads": int(getattr(cfg, "num_key_value_heads", heads) or heads),
        "head_dim": int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads),
        "vocab": int(cfg.vocab_size),
        "dtype_bytes": int(next(model.parameters()).element_size()),
    }


def device_spec(device: str, dtype: str = "float32") -> dict:
    """Memory, a measured matmul peak (in ``dtype``, the profile's: ``DeviceSpec.flops_per_s`` is
    the peak at the models' dtype) and copy bandwidth of the device.

    Both are timed after one untimed call: the first matmul on a GPU pays cuBLAS's lazy set-up
    (on an H200 it read 0.14 TFLOP/s), the first copy the destination's allocation. The copy goes
    into an existing buffer: ``clone()`` allocated fresh memory each time, and on CPU its page
    faults made the "bandwidth" ~3x too low.
    """
    cuda = str(device).startswith("cuda")
    if cuda:
        props = torch.cuda.get_device_properties(torch.device(device))
        name, memory = props.name, float(props.total_memory)
    else:
        name = f"CPU ({os.cpu_count()} cores)"
        memory = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    n = 4096 if cuda else 1024  # a 1024^3 matmul takes microseconds on a GPU: launch overhead, not the peak
    a = torch.randn(n, n, device=device, dtype=getattr(torch, dtype))
    a @ a  # warm-up
    sync_device(device)
    start = time.perf_counter()
    for _ in range(5):
        a @ a
    sync_device(device)
    flops = 5 * 2 * n**3 / (time.perf_counter() - start)
    big = torch.ones((256 if cuda else 32) * 1024 * 1024 // 4, device=device)  # float32; on a GPU larger than its L2 cache
    dst = torch.empty_like(big)
    dst.copy_(big)  # warm-up
    sync_device(device)
    start = time.perf_counter()
    for _ in range(5):
        dst.copy_(big)
    sync_device(device)
    bandwidth = 5 * 2 * big.numel() * big.element_size() / (time.perf_counter() - start)
    return {"name": name, "memory_bytes": memory, "bandwidth_bytes_per_s": float(bandwidth), "flops_per_s": float(flops), "reserve_bytes": 0.5e9 if not cuda else 1.0e9}


@torch.no_grad()
def time_pass(model: torch.nn.Module, b: int, q: int, c: int, repeats: int) -> float:
    """Median seconds of one forward pass of ``q`` tokens per row over ``c - q`` cached tokens."""
    from transformers import DynamicCache

    device = next(model.parameters()).device
    vocab = model.config.vocab_size
    past = c - q
    cache = DynamicCache()
    if past > 0:
        model(input_ids=torch.randint(0, vocab, (b, past), device=device), past_key_values=cache, use_cache=True)
    ids = torch.randint(0, vocab, (b, q), device=device)
    pos = torch.arange(past, c, device=device)[None, :].expand(b, q)
    times = []
    for _ in range(repeats + 1):  # the first is a warm-up
        sync_device(device)
        start = time.perf_counter()
        model(input_ids=ids, position_ids=pos, past_key_values=cache, use_cache=True)
        sync_device(device)
        times.append(time.perf_counter() - start)
        cache.crop(-q)
    return float(np.median(times[1:]))


def padded_lengths(b: int, s: int) -> list[int]:
    """Prompt lengths of a ``b``-row batch whose longest prompt is ``s``: spread evenly down to a
    quarter of ``s`` (a serving batch pads its rows to the longest)."""
    if b == 1:
        return [s]
    low = max(1, s // 4)
    return [int(round(s - i * (s - low) / (b - 1))) for i in range(b)]


@torch.no_grad()
def time_prefill(model: torch.nn.Module, b: int, s: int, repeats: int) -> float:
    """Median seconds of a prefill as the engines run it (``runtime.engines.prefill``): ``b``
    left-padded prompts of :func:`padded_lengths` with their attention mask and position ids.

    ``time_pass`` times unpadded passes, which take the plain causal path; a padded serving batch
    cannot, and on the project's pair its prefill cost ~10 % more (b 7, 134 tokens: 226 vs 206 ms).
    """
    from runtime.engines import prefill

    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(s * 1000 + b)
    vocab = model.config.vocab_size
    prompts = [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in padded_lengths(b, s)]
    times = []
    for _ in range(repeats + 1):  # the first is a warm-up
        sync_device(device)
        start = time.perf_counter()
        prefill(model, prompts)
        sync_device(device)
        times.append(time.perf_counter() - start)
    return float(np.median(times[1:]))
