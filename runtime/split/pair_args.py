"""The model-pair options the split entry points share (edge, server, benchmark, profile)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from runtime.pair import ModelPair


def add_pair_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--pair", type=Path, default=None, help="a built pair folder (target/ + draft/); default: the project's own pair")
    ap.add_argument("--preset", default="full", help="which own pair to build or load from the cache when --pair is not given (full, tiny, ...)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads in this process (>= 1)")
    ap.add_argument("--cpus", default=None, help="pin this process to these CPUs, e.g. 0, 0,2 or 1-3 (Linux; default: any): on one "
                    "machine, the edge and the server each on cores of their own, as on a testbed of two devices")


def load_pair_from_args(args: argparse.Namespace) -> ModelPair:
    from runtime.pair import PairQualityError, build_pair, device_dtype_problem, load_pair

    if args.threads < 1:
        raise SystemExit(f"--threads must be >= 1, got {args.threads}")
    if problem := device_dtype_problem(args.device, args.dtype):
        raise SystemExit(problem)
    if getattr(args, "cpus", None) is not None:
        from runtime.cpu_pinning import parse_cpus, pin_process

        try:
            pin_process(parse_cpus(args.cpus))  # before torch starts its thread pool: its threads inherit the CPUs
        except (ValueError, RuntimeError) as exc:
            raise SystemExit(str(exc)) from None
    torch.set_num_threads(args.threads)
    try:
        path = args.pair or build_pair(recipe=args.preset, progress=False)
        return load_pair(path, device=args.device, dtype=args.dtype)
    except (PairQualityError, FileNotFoundError, ValueError) as exc:
        raise SystemExit(str(exc)) from None
