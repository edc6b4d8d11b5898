"""The shared draft device's arbiter: on-demand drafting first come, first served; speculation
only on an idle device, never ahead of a queued block (runtime.split.draft_device)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
from fake_links import AcceptAllLink

from runtime.split import draft_device
from runtime.split.draft_device import SharedDraftDevice
from runtime.split.drafter import DraftChain


def _turn_events(monkeypatch, event_class) -> None:
    """The arbiter's on-demand turn events become ``event_class`` (threading itself is untouched)."""
    monkeypatch.setattr(draft_device, "threading", SimpleNamespace(Event=event_class, Lock=threading.Lock))


class Boom(Exception):
    """An interruption of a waiter (what a KeyboardInterrupt would be)."""


class InterruptedEvent(threading.Event):
    """A turn event whose wait is interrupted before the device is handed over."""

    def wait(self, timeout=None):
        raise Boom


class LateInterrupt(threading.Event):
    """A turn event whose wait is interrupted right after the device was handed over."""

    def wait(self, timeout=None):
        super().wait(timeout)
        raise Boom


def _wait_until(cond, timeout_s: float = 5.0) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("condition not reached")
        time.sleep(0.001)


def test_speculation_is_granted_only_on_an_idle_device():
    dev = SharedDraftDevice()
    with dev.if_idle() as granted:
        assert granted and dev.busy
        with dev.if_idle() as second:
            assert not second  # one step at a time
    assert not dev.busy
    with dev.on_demand() as waited:
        assert waited >= 0 and dev.busy
        with dev.if_idle() as granted:
            assert not granted
    assert (dev.on_demand_grants, dev.speculative_grants) == (1, 1)


def test_a_queued_block_closes_the_device_to_speculation():
    """The plain lock's failure: after the holder releases, a speculator that asks before the woken
    on-demand waiter has run must be refused."""
    dev = SharedDraftDevice()
    order: list[str] = []
    holder = dev.on_demand()
    holder.__enter__()
    waiter_in = threading.Event()

    def waiter():
        with dev.on_demand():
            order.append("block")
            waiter_in.set()
            time.sleep(0.01)

    t = threading.Thread(target=waiter)
    t.start()
    _wait_until(lambda: dev.waiting == 1)
    holder.__exit__(None, None, None)
    # the waiter may not have run yet: whatever the interleaving, speculation is refused until the block is drafted
    while not waiter_in.is_set():
        with dev.if_idle() as granted:
            if granted:
                order.append("speculation")
    t.join(5)
    assert order == ["block"]


def test_on_demand_requests_are_served_in_arrival_order():
    dev = SharedDraftDevice()
    served: list[int] = []
    gate = dev.on_demand()
    gate.__enter__()
    threads = []
    for i in range(6):
        def client(i=i):
            with dev.on_demand():
                served.append(i)
        t = threading.Thread(target=client)
        t.start()
        threads.append(t)
        _wait_until(lambda i=i: dev.waiting == i + 1)  # queued in this order
    gate.__exit__(None, None, None)
    for t in threads:
        t.join(5)
    assert served == list(range(6))
    assert dev.on_demand_grants == 7 and dev.waiting == 0 and not dev.busy


def test_wait_idle_wakes_on_its_event_and_on_release():
    dev = SharedDraftDevice()
    with dev.on_demand():
        assert dev.wait_idle(threading.Event(), lambda: False, timeout_s=0.01) is False  # busy: times out, not free
        wake, result = threading.Event(), []
        t = threading.Thread(target=lambda: result.append(dev.wait_idle(wake, wake.is_set, timeout_s=30)))
        t.start()
        time.sleep(0.01)
        wake.set()  # what a verdict's done-callback does
        t.join(5)
        assert not t.is_alive() and result == [False]
    t = threading.Thread(target=lambda: result.append(dev.wait_idle(threading.Event(), lambda: False, timeout_s=30)))
    with dev.on_demand():
        t.start()
        time.sleep(0.01)
    t.join(5)  # the release wakes it
    assert not t.is_alive() and result == [False, True]


def test_a_verdict_before_the_sleep_is_not_lost():
    """The verdict's event set before wait_idle clears it: stop() is checked after registering."""
    dev = SharedDraftDevice()
    with dev.on_demand():
        wake = threading.Event()
        wake.set()
        t0 = time.perf_counter()
        assert dev.wait_idle(wake, lambda: True, timeout_s=30) is False
        assert time.perf_counter() - t0 < 10


def test_a_release_wakes_one_speculator_and_a_stopped_one_passes_it_on():
    dev = SharedDraftDevice()
    woken: list[int] = []
    stopped = [False, False, False]
    events = [threading.Event() for _ in stopped]
    holder = dev.on_demand()
    holder.__enter__()

    def sleeper(i):
        if dev.wait_idle(events[i], lambda: stopped[i], timeout_s=30) and not stopped[i]:
            woken.append(i)

    threads = []
    for i in range(3):
        threads.append(threading.Thread(target=sleeper, args=(i,)))
        threads[-1].start()
        _wait_until(lambda i=i: len(dev._sleepers) == i + 1)
    stopped[0] = True  # the first in line no longer wants the device (its verdict came, its event not yet set)
    holder.__exit__(None, None, None)
    _wait_until(lambda: woken == [1])  # 0 passed it on to 1; 2 still sleeps
    time.sleep(0.05)
    assert threads[2].is_alive() and woken == [1]
    events[2].set()
    for t in threads:
        t.join(5)
    assert woken == [1, 2]


def test_an_interrupted_waiter_leaves_the_queue_and_the_holder_keeps_the_device(monkeypatch):
    dev = SharedDraftDevice()
    with dev.on_demand():
        _turn_events(monkeypatch, InterruptedEvent)  # the waiter's turn event
        with pytest.raises(Boom):
            with dev.on_demand():
                pass
        assert dev.waiting == 0
        assert dev.busy  # still the holder's: no double release
        with dev.if_idle() as granted:
            assert not granted
    with dev.if_idle() as granted:
        assert granted  # nobody left queued, nobody holds it


def test_many_clients_never_overlap_and_blocks_wait_at_most_one_step():
    """Speculators hammering the device: at most one holder at a time, and every on-demand block
    gets the device with at most one speculative step ahead of it."""
    dev = SharedDraftDevice()
    holders, overlap, stop = [0], [False], threading.Event()
    spec_steps_while_waiting: list[int] = []
    lock = threading.Lock()

    def hold(seconds):
        with lock:
            holders[0] += 1
            overlap[0] |= holders[0] > 1
        time.sleep(seconds)
        with lock:
            holders[0] -= 1

    wakes = [threading.Event() for _ in range(6)]

    def speculator(i):
        while not stop.is_set():
            with dev.if_idle() as granted:
                if granted:
                    hold(0.0005)
                    continue
            dev.wait_idle(wakes[i], stop.is_set, 0.05)

    def blocker():
        for _ in range(20):
            before = dev.speculative_grants
            with dev.on_demand():
                spec_steps_while_waiting.append(dev.speculative_grants - before)
                hold(0.001)
            time.sleep(0.002)

    specs = [threading.Thread(target=speculator, args=(i,)) for i in range(6)]
    blocks = [threading.Thread(target=blocker) for _ in range(3)]
    for t in specs + blocks:
        t.start()
    for t in blocks:
        t.join(30)
    stop.set()
    for wake in wakes:
        wake.set()
    for t in specs:
        t.join(5)
    assert not overlap[0]
    assert dev.on_demand_grants == 60 and dev.speculative_grants > 0
    # once a block is queued no speculative step starts; only one can slip in between reading the
    # counter and joining the queue
    assert max(spec_steps_while_waiting) <= 1


def test_a_waiter_interrupted_after_the_hand_over_passes_the_device_on(monkeypatch):
    dev = SharedDraftDevice()
    holder = dev.on_demand()
    holder.__enter__()
    errors: list[BaseException] = []

    def waiter():
        try:
            with dev.on_demand():
                pass
        except Boom as exc:
            errors.append(exc)

    _turn_events(monkeypatch, LateInterrupt)
    t = threading.Thread(target=waiter)
    t.start()
    _wait_until(lambda: dev.waiting == 1)
    assert dev.busy
    holder.__exit__(None, None, None)
    t.join(5)
    assert len(errors) == 1 and not dev.busy and dev.waiting == 0


def test_a_spent_wake_up_does_not_end_the_next_sleep():
    dev = SharedDraftDevice()
    wake = threading.Event()
    wake.set()  # left over from an earlier wake-up
    with dev.on_demand():
        t0 = time.perf_counter()
        assert dev.wait_idle(wake, lambda: False, timeout_s=0.2) is False
        assert time.perf_counter() - t0 >= 0.15  # it slept (a lower bound: sleeping cannot be faster)


def test_an_idle_device_is_free_at_once():
    dev = SharedDraftDevice()
    t0 = time.perf_counter()
    assert dev.wait_idle(threading.Event(), lambda: False, timeout_s=30) is True
    assert time.perf_counter() - t0 < 10


def test_on_demand_wait_is_counted():
    dev = SharedDraftDevice()
    holder = dev.on_demand()
    holder.__enter__()
    threading.Timer(0.1, lambda: holder.__exit__(None, None, None)).start()
    with dev.on_demand() as waited:
        assert waited >= 0.09
    assert dev.on_demand_wait_s >= 0.09 and dev.on_demand_grants == 2


def _held_with_a_sleeper(dev):
    """Hold ``dev`` for a block and put one speculator to sleep on it; returns the held
    ``on_demand`` context (exit it to release), the sleeper's wake event and its thread."""
    wake = threading.Event()
    holder = dev.on_demand()
    holder.__enter__()
    t = threading.Thread(target=lambda: dev.wait_idle(wake, lambda: False, timeout_s=30))
    t.start()
    _wait_until(lambda: len(dev._sleepers) == 1)
    return holder, wake, t


def test_a_hand_over_to_a_queued_block_wakes_no_speculator():
    dev = SharedDraftDevice()
    holder, sleeper_wake, t = _held_with_a_sleeper(dev)
    got = threading.Event()
    release_second = threading.Event()

    def block():
        with dev.on_demand():
            got.set()
            release_second.wait(5)

    b = threading.Thread(target=block)
    b.start()
    _wait_until(lambda: dev.waiting == 1)
    holder.__exit__(None, None, None)
    assert got.wait(5)
    assert not sleeper_wake.is_set()  # the device went to the block, not to the speculator
    release_second.set()
    b.join(5)
    t.join(5)  # the block's release wakes it
    assert not t.is_alive() and sleeper_wake.is_set()


def test_pass_on_wakes_a_sleeper_only_on_an_idle_device():
    dev = SharedDraftDevice()
    holder, wake, t = _held_with_a_sleeper(dev)
    dev.pass_on()  # busy: nothing to pass
    assert not wake.is_set()
    dev._busy = False  # as if the release's wake-up went to a speculator that then stopped without using it
    dev.pass_on()
    t.join(5)
    assert wake.is_set() and not t.is_alive()
    dev._busy = True
    holder.__exit__(None, None, None)


class _FakeSession(DraftChain):
    """A draft chain without a model: each draft step appends token 7."""

    def __init__(self, chain=()):
        super().__init__([1, 2])
        self.chain = list(chain)

    def extend(self, upto, stop=None, speculative=False):
        while len(self.chain) < upto and not (stop is not None and stop()):
            self.record_draft(7)

    def commit(self, depth, accepted, bonus):
        self.tokens.extend(self.chain[:accepted] + [bonus])
        self.chain = []
        return False


@pytest.mark.parametrize("chain, max_new", [([7, 7, 7], 4), ([], 1)], ids=["block-already-drafted", "depth-0"])
def test_a_block_with_nothing_to_draft_does_not_queue_for_the_device(monkeypatch, chain, max_new):
    from runtime.split import edge_client

    session = _FakeSession(chain)
    monkeypatch.setattr(edge_client, "DraftSession", lambda draft, prompt: session)
    dev = SharedDraftDevice()
    client = edge_client.EdgeClient(None, AcceptAllLink(), depth=3, proactive=False, draft_device=dev)
    holder = dev.on_demand()  # another client drafts meanwhile (0.3 s): a queued request would wait for it
    holder.__enter__()
    timer = threading.Timer(0.3, lambda: holder.__exit__(None, None, None))
    timer.start()
    out = client.generate([1, 2], max_new)
    timer.join(5)
    assert out.outcome == "length" and out.iterations[0].device_wait_ms == 0.0 and session.draft_steps == 0
    assert dev.on_demand_grants == 1  # only the other client's
