"""One draft device shared by the edge clients of one process: on-demand drafting first, in the
order the clients asked; proactive drafting only on an idle device.

A client drafts *on demand* when its verdict has come back and it needs the next block before it
can send; it drafts *proactively* while its own verification is in flight, on a guess that may be
thrown away. On a testbed every SpecEdge client has a GPU of its own and the two never meet; when
one process emulates many clients on one device (``runtime.edge --shared-device on``) they do, and
speculation must never delay another client's block -- that delay is on the critical path of that
client's inter-token latency, while a proactive step only shortens a wait.

Why not one :class:`threading.Lock` with a non-blocking acquire for speculation (this project's
first version): a lock is not fair. A speculating thread that releases it still holds the GIL and
takes it straight back with its next non-blocking acquire, before the on-demand waiter the release
woke has run, so one client's speculation (up to ``2 * depth + 1`` steps) could run ahead of
another's block. Here a queued on-demand request closes the device to speculation, and the device
is handed from one on-demand request to the next in arrival order.

Every wake-up is aimed: a release hands the device to the head of the on-demand queue, or else
wakes one sleeping speculator; a speculator also wakes on its own event (set when its verdict
arrives): a first version that woke every waiter at each release (one shared condition's
``notify_all``) lost ITL to the plain lock at 16-32 clients even with proactive drafting off, where
only the thread switches differ. Against the plain lock, paired (``python -m experiments.split_bench_ab``;
``results/split_bench/ab_vs_0528034``): with proactive drafting on, ITL 18-34 % lower at 8-32
clients; off, within the runs' noise (-9 % to +14 %).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class SharedDraftDevice:
    """The arbiter of one draft device (see the module docstring). Thread-safe.

    Counters (for logs and tests): ``on_demand_grants``, ``speculative_grants`` and
    ``on_demand_wait_s`` -- the total seconds on-demand requests waited for the device.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._busy = False
        self._queue: deque[threading.Event] = deque()  #: on-demand requests waiting, in arrival order
        self._sleepers: deque[threading.Event] = deque()  #: speculators waiting for an idle device
        self.on_demand_grants = 0
        self.speculative_grants = 0
        self.on_demand_wait_s = 0.0

    @property
    def busy(self) -> bool:
        return self._busy

    @property
    def waiting(self) -> int:
        """On-demand requests queued for the device now."""
        return len(self._queue)

    @contextmanager
    def on_demand(self) -> Iterator[float]:
        """Hold the device for a client's next block; yields the seconds it waited for it."""
        t0 = time.perf_counter()
        with self._lock:
            turn = None
            if self._busy or self._queue:
                turn = threading.Event()
                self._queue.append(turn)
            else:
                self._busy = True
        if turn is not None:
            try:
                turn.wait()  # the holder's release hands the device over (it stays busy)
            except BaseException:
                with self._lock:
                    queued = turn in self._queue
                    if queued:
                        self._queue.remove(turn)
                if not queued:  # handed over meanwhile: give it on
                    self._release()
                raise
        try:  # held from here on: nothing may run between the grant and this try
            waited = time.perf_counter() - t0
            with self._lock:
                self.on_demand_grants += 1
                self.on_demand_wait_s += waited
            yield waited
        finally:
            self._release()

    @contextmanager
    def if_idle(self) -> Iterator[bool]:
        """Hold the device for one speculative step if nobody drafts or waits to; yields whether
        it was granted (when False, do not draft)."""
        with self._lock:
            granted = self._free()
            if granted:
                self._busy = True
                self.speculative_grants += 1
        try:
            yield granted
        finally:
            if granted:
                self._release()

    def wait_idle(self, wake: threading.Event, stop: Callable[[], bool], timeout_s: float) -> bool:
        """Sleep until a release finds this speculator next in line, ``wake`` is set (e.g. by its
        verdict's done-callback) or ``timeout_s`` passes; returns whether the device is free for
        speculation. A speculator woken for an idle device that no longer wants it (``stop()``)
        passes the wake-up on, so the device never idles while another speculator sleeps."""
        with self._lock:
            if self._free():
                return True
            wake.clear()
            self._sleepers.append(wake)
        stopped = True  # if stop() itself raises: pass any wake-up on
        try:
            stopped = stop()
            if not stopped:  # a verdict that arrived before the clear() is seen here, one after it sets ``wake``
                wake.wait(timeout_s)
                stopped = stop()
        finally:
            with self._lock:
                if wake in self._sleepers:
                    self._sleepers.remove(wake)
                free = self._free()
                if free and stopped:
                    self._wake_one_sleeper()
        return free

    def pass_on(self) -> None:
        """A speculator that stops (its verdict came, its chain is full) hands a wake-up it may
        have been given to the next sleeper, if the device is idle: call it when a speculation loop
        ends, so the device never idles while another speculator sleeps."""
        with self._lock:
            if self._free():
                self._wake_one_sleeper()

    def _free(self) -> bool:
        # a queued on-demand request implies a busy device: a release hands it straight to the
        # queue's head, so the device is never idle while a block waits
        return not self._busy

    def _wake_one_sleeper(self) -> None:
        if self._sleepers:
            self._sleepers.popleft().set()

    def _release(self) -> None:
        with self._lock:
            if self._queue:
                self._queue.popleft().set()  # stays busy: the next block's
            else:
                self._busy = False
                self._wake_one_sleeper()


__all__ = ["SharedDraftDevice"]
