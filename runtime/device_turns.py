"""Weighted turns on one device between threads that each run whole steps: the plan's compute shares, enforced.

The v1 model (``envs.split_plan``) gives the ED verify batch a compute share ``zeta_E`` of the server
and the AD / SD batches the rest. With ``placement=split`` the verifier runs in its own thread
(:class:`runtime.split.batcher.VerificationBatcher`) beside the round's engine thread
(:func:`runtime.executor.run_shared`); left alone, the OS time-slices the two (about half each while
both run, whatever the plan said). :class:`DeviceTurns` makes the shares the plan's: each thread
takes a *turn* for every step (one engine step, one verification pass), one turn at a time, and
the turn goes to the waiting party with the least virtual time ``used seconds / share``.

**Start-time fair queueing (choice).** A party that starts waiting after an idle spell has its
virtual time raised to the system's (the start tag of the turn in progress, or of the last one):
a verifier that idled while its edges drafted does not bank the idle time and then hold the device
for a burst. A share change rescales each party's lead over the system's virtual time by old /
new share, so time charged at a tiny share does not lock a party out after its share grows.

**Anticipation (choice).** Between two of its turns a party has a short gap of its own (the
batcher hands out verdicts and takes its next batch). Without more, the other party's whole step
would start in every such gap and a party with short steps would get one step per step of the
other, whatever the shares (a helper's red-team measured 0.21 of the device at share 0.8 with 4 ms
against 1 ms steps). So when a turn ends, a party in such a gap -- the one whose turn just ended,
or one whose turn ended less than ``anticipate_s`` ago and has not asked again -- that is behind
every party that would go instead (less virtual time) has the device held for it until
``anticipate_s`` (default 2 ms) after its own turn ended; if it does not come back in that time
the others go on. The cost is at most ``anticipate_s`` of idle device per turn of that party, and
only while it is behind its share.

So over any stretch in which both parties have work, each gets its share of the device time (to
within one step); while one idles the other runs alone (work-conserving but for the anticipation
window; the model's fixed sharing lends nothing, so a party never gets less than the model gives
it, but for waiting out the step in progress -- turns are whole steps, there is no preemption).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

MIN_SHARE = 1e-6  #: a share below this counts as this (a zero share would never get a turn)
ANTICIPATE_S = 0.002  #: how long the device waits for a party that is behind its share to come back, s


class DeviceTurns:
    """Weighted fair turns between named parties on one device (thread-safe).

    ``shares`` maps a party's name to its compute share (any positive weights; only their ratios
    matter). :meth:`turn` is the context manager a party holds around one step; ``used_s`` and
    ``waited_s`` have each party's seconds inside its turns and waiting for them.
    """

    def __init__(self, shares: dict[str, float], anticipate_s: float = ANTICIPATE_S):
        if not shares:
            raise ValueError("shares must name at least one party")
        if isinstance(anticipate_s, bool) or not isinstance(anticipate_s, int | float) or not 0 <= anticipate_s <= 1:
            raise ValueError(f"anticipate_s must be seconds in [0, 1], got {anticipate_s!r}")
        self.anticipate_s = float(anticipate_s)
        self._reserved: tuple[str, float] | None = None  #: (party, monotonic deadline): the device held for it
        self._last_end: dict[str, float] = {}  #: monotonic time each party's last turn ended
        self._cond = threading.Condition()
        self._share = _checked(shares)
        self._vt = dict.fromkeys(self._share, 0.0)  #: virtual time: used seconds / share
        self._system_vt = 0.0  #: the start tag of the turn in progress (or of the last one)
        self._holder: str | None = None
        self._waiting: set[str] = set()
        self.used_s = dict.fromkeys(self._share, 0.0)  #: device seconds per party (inside its turns)
        self.waited_s = dict.fromkeys(self._share, 0.0)  #: seconds per party spent waiting for a turn

    def set_shares(self, shares: dict[str, float]) -> None:
        """Set some parties' shares (a new round's plan); the parties are those named at construction."""
        unknown = sorted(set(shares) - set(self._share))
        if unknown:
            raise ValueError(f"unknown part{'y' if len(unknown) == 1 else 'ies'} {unknown}; known: {sorted(self._share)}")
        checked = _checked(shares)
        with self._cond:
            for name, share in checked.items():
                lead = self._vt[name] - self._system_vt
                if lead > 0:  # time charged at the old share, re-read at the new one
                    self._vt[name] = self._system_vt + lead * self._share[name] / share
            self._share.update(checked)

    def share(self, name: str) -> float:
        """``name``'s share now (floored at :data:`MIN_SHARE`)."""
        return self._share[name]

    @property
    def holder(self) -> str | None:
        """The party inside its turn now, or None."""
        return self._holder

    @property
    def waiting(self) -> frozenset[str]:
        """The parties waiting for a turn now."""
        with self._cond:
            return frozenset(self._waiting)

    def _next(self) -> str | None:
        """The waiting party whose turn it is (least virtual time; ties by name, for determinism)."""
        return min(self._waiting, key=lambda n: (self._vt[n], n)) if self._waiting else None

    def _held_for_other(self, name: str) -> float:
        """Seconds the device is still held for another party that is behind (0: not held for another)."""
        if self._reserved is None or self._reserved[0] == name:
            return 0.0
        left = self._reserved[1] - time.monotonic()
        if left <= 0:
            self._reserved = None
            return 0.0
        return left

    def _anticipate(self, ended: str) -> None:
        """After ``ended``'s turn: hold the device for a party in a short gap of its own -- ``ended``
        itself, or one whose turn ended less than ``anticipate_s`` ago and has not asked again -- that
        is behind every party that would go instead (it would have the next turn, were it waiting)."""
        if self.anticipate_s <= 0:
            return
        now = time.monotonic()
        recent = [p for p in self._vt if p == ended or (p not in self._waiting and now - self._last_end.get(p, -float("inf")) < self.anticipate_s)]
        for p in sorted(recent, key=lambda n: (self._vt[n], n)):
            rivals = (self._waiting | ({ended} if p != ended else set())) - {p}
            if rivals and self._vt[p] < min(self._vt[r] for r in rivals):
                self._reserved = (p, self._last_end[p] + self.anticipate_s)
                return

    @contextmanager
    def turn(self, name: str) -> Iterator[None]:
        """Hold the device for one step of ``name``; the step's wall time is charged at its share."""
        if name not in self._vt:
            raise ValueError(f"unknown party {name!r}; known: {sorted(self._vt)}")
        asked = time.perf_counter()
        with self._cond:
            if self._holder == name or name in self._waiting:
                raise RuntimeError(f"party {name!r} already holds or waits for a turn (turns are not re-entrant)")
            self._vt[name] = max(self._vt[name], self._system_vt)  # no credit for idle time
            self._waiting.add(name)
            try:
                while True:
                    held = self._held_for_other(name)
                    if self._holder is None and not held and self._next() == name:
                        break
                    self._cond.wait(held or None)
            except BaseException:
                # interrupted while waiting: a waiter left behind would hold every other party back
                self._cond.notify_all()
                raise
            finally:
                self._waiting.discard(name)
            self._holder, self._system_vt, self._reserved = name, self._vt[name], None
        start = time.perf_counter()
        try:
            yield
        finally:
            end = time.perf_counter()
            with self._cond:
                self._vt[name] += (end - start) / self._share[name]
                self.used_s[name] += end - start
                self.waited_s[name] += start - asked
                self._holder = None
                self._last_end[name] = time.monotonic()
                self._anticipate(name)
                self._cond.notify_all()


def _checked(shares: dict[str, float]) -> dict[str, float]:
    """``shares`` as floats floored at :data:`MIN_SHARE`; a clear error naming a bad one."""
    out = {}
    for name, share in shares.items():
        if isinstance(share, bool) or not isinstance(share, int | float) or not 0 <= share < float("inf"):
            raise ValueError(f"share of {name!r} must be a finite number >= 0, got {share!r}")
        out[name] = max(float(share), MIN_SHARE)
    return out
