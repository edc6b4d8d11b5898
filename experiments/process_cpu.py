"""A process's CPU time sampled over wall-clock time, so the CPU it spent inside any window can be
read off afterwards (``experiments.split_bench``: the split server's CPU seconds while serving,
without its model loading and idle exit). Linux only (``/proc``); elsewhere the sampler stops at
once and every window reads None."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np


def _cpu_seconds(pid: int) -> float | None:
    """A live process's CPU time so far (user + sys, s) from /proc (None where there is no /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime: fields 14 and 15 of stat


class CpuSampler:
    """Samples a process's CPU seconds every ``period_s`` (wall clock, CPU) in a thread, so the CPU
    it spent inside any wall-clock window can be read off afterwards (:meth:`between`)."""

    def __init__(self, pid: int, period_s: float = 0.01):
        self.pid, self.period_s = pid, period_s
        self.samples: list[tuple[float, float]] = []  #: (time.time(), CPU seconds)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            cpu = _cpu_seconds(self.pid)
            if cpu is None:
                return
            self.samples.append((time.time(), cpu))
            self._stop.wait(self.period_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def between(self, start: float, end: float) -> float | None:
        """CPU seconds spent in ``[start, end]`` (wall clock, s; linear between samples), None if
        the samples do not cover the window."""
        if len(self.samples) < 2 or not self.samples[0][0] <= start < end <= self.samples[-1][0]:
            return None
        t, c = zip(*self.samples, strict=True)
        return float(np.interp(end, t, c) - np.interp(start, t, c))


__all__ = ["CpuSampler"]
