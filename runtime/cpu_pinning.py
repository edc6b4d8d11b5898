"""Pin a process to CPUs, so that on one machine the edge and the server each run on cores of their own.

On a testbed the edge drafts on its own device and the server verifies on another; on one box both
are processes on the same cores, and whatever one computes (the edge's proactive drafting, say)
slows the other. ``experiments.split_bench`` therefore pins the server and the edge to different
cores (``--pin-cpus``), and every split entry point takes ``--cpus`` (``runtime.split.pair_args``).

Linux only (``os.sched_setaffinity``). A thread created after the call inherits its creator's CPUs;
the threads that already exist (``import torch`` starts one) are pinned one by one, so the whole
process is pinned.
"""

from __future__ import annotations

import os
from collections.abc import Iterable


def available_cpus() -> set[int]:
    """The CPUs this process may run on (all of them where affinity is not supported)."""
    if hasattr(os, "sched_getaffinity"):
        return set(os.sched_getaffinity(0))
    return set(range(os.cpu_count() or 1))


def parse_cpus(spec: str, field: str = "--cpus") -> set[int]:
    """``"0"``, ``"0,2"``, ``"1-3"`` or a mix (``"0,2-3"``) as a set of CPU numbers; a clear error
    naming ``field`` and the CPUs available otherwise."""
    cpus: set[int] = set()
    allowed = available_cpus()
    try:
        for part in (p.strip() for p in str(spec).split(",")):
            lo, _, hi = part.partition("-")
            first, last = int(lo), int(hi) if hi else int(lo)
            if first < 0 or last < first:
                raise ValueError(part)
            cpus.update(range(first, last + 1))
    except ValueError:
        raise ValueError(f"{field} must list CPU numbers like 0, 0,2 or 1-3 (available: {_fmt(allowed)}), got {spec!r}") from None
    if not cpus <= allowed:
        raise ValueError(f"{field} asks for CPU(s) {_fmt(cpus - allowed)}, which this process may not use (available: {_fmt(allowed)})")
    return cpus


def pin_process(cpus: Iterable[int]) -> None:
    """Pin every thread of this process to ``cpus`` (and so every thread it starts later)."""
    cpus = set(cpus)
    if not hasattr(os, "sched_setaffinity"):
        raise RuntimeError("pinning to CPUs needs os.sched_setaffinity (Linux)")
    if not cpus:
        raise ValueError("pin_process needs at least one CPU")
    tasks = os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else [str(os.getpid())]
    for tid in tasks:
        try:
            os.sched_setaffinity(int(tid), cpus)
        except ProcessLookupError:  # a thread that ended meanwhile
            pass


def process_cpus() -> list[set[int]]:
    """The CPUs of each thread of this process (for tests and logs)."""
    out = []
    for tid in os.listdir("/proc/self/task"):
        try:
            out.append(set(os.sched_getaffinity(int(tid))))
        except ProcessLookupError:  # a thread that ended meanwhile
            pass
    return out


def _fmt(cpus: set[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus)) or "none"
