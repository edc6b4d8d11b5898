"""runtime.device_turns: weighted fair turns on one device -- exclusion, the shares over a busy
stretch, no credit for idle time, work conservation, faults and bad input."""

import threading
import time

import pytest

from runtime import device_turns
from runtime.device_turns import MIN_SHARE, DeviceTurns
from runtime.executor import run_shared

STEP_S = 0.001


class FakeClock:
    """The turns' clock: a step advances it by its own length, so what each party is charged does
    not depend on the host's load (only the interleaving of the threads does)."""

    def __init__(self):
        self.now, self.lock = 0.0, threading.Lock()

    def perf_counter(self) -> float:
        with self.lock:
            return self.now

    def advance(self, s: float) -> None:
        with self.lock:
            self.now += s


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(device_turns, "time", fake)
    return fake


def busy(turns: DeviceTurns, clock: FakeClock, name: str, stop: threading.Event, order: list[str], inside: list[int], step_s: float = STEP_S) -> None:
    """Take turns until ``stop``: each holds the device for ``step_s`` on ``clock``, recorded in ``order``."""
    while not stop.is_set():
        with turns.turn(name):
            inside[0] += 1
            assert inside[0] == 1, "two parties inside their turns at once"
            order.append(name)
            clock.advance(step_s)
            time.sleep(0)  # let the other thread run (it may try to take the device: it must wait)
            inside[0] -= 1


def run_parties(turns: DeviceTurns, clock: FakeClock, names: list[str], total_turns: int, steps: dict[str, float] | None = None,
                order: list[str] | None = None) -> list[str]:
    """Every party in ``names`` busy until ``total_turns`` more turns have been taken."""
    stop, order, inside = threading.Event(), order if order is not None else [], [0]
    target = len(order) + total_turns
    threads = [threading.Thread(target=busy, args=(turns, clock, n, stop, order, inside, (steps or {}).get(n, STEP_S))) for n in names]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while len(order) < target and time.monotonic() < deadline:
        time.sleep(0.001)
    stop.set()
    for t in threads:
        t.join(10)
    assert len(order) >= target, "the parties stalled"
    return order


@pytest.mark.parametrize("shares", [{"ed": 0.25, "engine": 0.75}, {"ed": 0.5, "engine": 0.5}, {"ed": 0.9, "engine": 0.1}])
def test_two_busy_parties_get_the_device_in_their_shares(clock, shares):
    turns = DeviceTurns(shares)
    run_parties(turns, clock, list(shares), 400)
    total = sum(turns.used_s.values())
    for name, share in shares.items():
        # over a stretch where both have work, device time follows the shares to within a step or two
        assert turns.used_s[name] / total == pytest.approx(share, abs=0.02), turns.used_s


def test_unequal_steps_still_split_device_time_by_share(clock):
    """A party with long steps (an SD iteration) against one with short ones (a verify pass): the
    shares hold for device *time*, not for the number of turns."""
    turns = DeviceTurns({"engine": 0.5, "ed": 0.5})
    order = run_parties(turns, clock, ["engine", "ed"], 500, steps={"engine": 0.004, "ed": 0.001})
    total = sum(turns.used_s.values())
    assert turns.used_s["ed"] / total == pytest.approx(0.5, abs=0.03)
    assert order.count("ed") > 3 * order.count("engine")


def test_a_party_alone_never_waits_and_runs_back_to_back(clock):
    turns = DeviceTurns({"engine": 0.01, "ed": 0.99})  # a tiny share does not slow a party that is alone
    order = run_parties(turns, clock, ["engine"], 100)
    assert set(order) == {"engine"}
    assert turns.waited_s["engine"] == 0.0 and turns.used_s["ed"] == 0.0


def test_idle_time_is_not_banked(clock):
    """The verifier idles while its edges draft; when it comes back it takes turns at its share at
    once, not a burst repaying the idle spell (start-time fair queueing)."""
    turns = DeviceTurns({"engine": 0.5, "ed": 0.5})
    order = run_parties(turns, clock, ["engine"], 200)  # 'ed' idle: it falls 200 steps behind in used time
    ed_from = len(order)
    run_parties(turns, clock, ["engine", "ed"], 100, order=order)
    after = order[ed_from:]
    window = after[after.index("ed"):][:40]
    # equal shares and steps: about every other turn; a banked credit would give 'ed' all 40
    assert 16 <= window.count("ed") <= 24, window


def test_share_changes_apply_to_the_next_turns(clock):
    turns = DeviceTurns({"engine": 0.5, "ed": 0.5})
    run_parties(turns, clock, ["engine", "ed"], 200)
    before = dict(turns.used_s)
    turns.set_shares({"engine": 0.2, "ed": 0.8})
    run_parties(turns, clock, ["engine", "ed"], 500)
    used = {n: turns.used_s[n] - before[n] for n in before}
    assert used["ed"] / sum(used.values()) == pytest.approx(0.8, abs=0.03), used


def test_a_fault_inside_a_turn_releases_the_device():
    turns = DeviceTurns({"engine": 1.0, "ed": 1.0})
    with pytest.raises(ZeroDivisionError), turns.turn("ed"):
        raise ZeroDivisionError("a fault in a verification pass")
    done = threading.Event()

    def other():
        with turns.turn("engine"):
            done.set()

    t = threading.Thread(target=other)
    t.start()
    t.join(5)
    assert done.is_set()


def test_turns_are_not_reentrant():
    turns = DeviceTurns({"engine": 1.0})
    with turns.turn("engine"), pytest.raises(RuntimeError, match="not re-entrant"), turns.turn("engine"):
        pass


@pytest.mark.parametrize("shares, words", [
    ({}, "at least one party"),
    ({"ed": -0.1}, "share of 'ed' must be a finite number >= 0"),
    ({"ed": float("nan")}, "share of 'ed'"),
    ({"ed": float("inf")}, "share of 'ed'"),
    ({"ed": True}, "share of 'ed'"),
    ({"ed": "0.5"}, "share of 'ed'"),
])
def test_bad_shares_are_refused_naming_the_party(shares, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace("[", r"\[")):
        DeviceTurns(shares)


def test_unknown_parties_are_refused():
    turns = DeviceTurns({"engine": 1.0, "ed": 0.0})
    assert turns.share("ed") == MIN_SHARE  # a zero share still gets turns when alone
    with pytest.raises(ValueError, match=r"unknown party \['sd'\]; known: \['ed', 'engine'\]"):
        turns.set_shares({"sd": 0.5})
    with pytest.raises(ValueError, match="unknown party 'sd'"), turns.turn("sd"):
        pass


def test_run_shared_takes_each_engine_step_as_a_turn():
    """The round's engine thread: every step inside one of its party's turns, its time charged there."""
    turns = DeviceTurns({"engine": 0.5, "ed": 0.5})
    held = []

    def steps(n):
        for _ in range(n):
            held.append(turns.holder)
            time.sleep(STEP_S)
            yield
        return n

    runs = run_shared({"ad": (steps(3), 0.5), "sd": (steps(4), 0.5)}, turns=turns, party="engine")
    assert held == ["engine"] * 7
    assert {k: r.result for k, r in runs.items()} == {"ad": 3, "sd": 4}
    assert turns.used_s["engine"] == pytest.approx(sum(r.device_s for r in runs.values()), rel=0.05, abs=2e-3)


def test_a_waiter_interrupted_while_waiting_does_not_block_the_others(monkeypatch):
    """An exception raised inside the wait (an interrupt) takes the waiter out of the queue: the
    next party gets the device."""
    turns = DeviceTurns({"engine": 1.0, "ed": 1.0, "sd": 1.0})
    entered, release = threading.Event(), threading.Event()

    def holder():
        with turns.turn("engine"):
            entered.set()
            release.wait(5)

    t = threading.Thread(target=holder)
    t.start()
    entered.wait(5)
    real_wait = threading.Condition.wait
    calls = []

    def interrupted(self, timeout=None):
        if threading.current_thread() is threading.main_thread() and not calls:
            calls.append(1)
            raise KeyboardInterrupt
        return real_wait(self, timeout)

    monkeypatch.setattr(threading.Condition, "wait", interrupted)
    with pytest.raises(KeyboardInterrupt), turns.turn("ed"):  # 'ed' < 'sd': it would be next
        pass
    monkeypatch.setattr(threading.Condition, "wait", real_wait)
    got = threading.Event()

    def other():
        with turns.turn("sd"):
            got.set()

    o = threading.Thread(target=other)
    o.start()
    release.set()
    t.join(5)
    o.join(5)
    assert got.is_set()
