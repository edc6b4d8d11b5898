"""runtime.device_turns: weighted fair turns on one device -- exclusion, the shares over a busy
stretch, no credit for idle time, work conservation, faults and bad input."""

import threading
import time

import pytest

from runtime import device_turns
from runtime.device_turns import MIN_SHARE, DeviceTurns
from runtime.executor import run_shared

STEP_S = 0.001
#: the anticipation window of the tests whose parties are always busy: a party behind its share comes
#: back at once, but a loaded host may deschedule its thread past the default 2 ms, and the device
#: would then go to the other party, off the shares (two such failures in a CI run beside other
#: tests); a long window changes nothing else here (the fake clock charges steps, not waits)
BUSY_ANTICIPATE_S = 0.25


class FakeClock:
    """The turns' clock: a step advances it by its own length, so what each party is charged does
    not depend on the host's load (only the interleaving of the threads does)."""

    def __init__(self):
        self.now, self.lock = 0.0, threading.Lock()

    def perf_counter(self) -> float:
        with self.lock:
            return self.now

    @staticmethod
    def monotonic() -> float:
        """The anticipation window's clock stays real: it bounds a real wait."""
        return time.monotonic()

    def advance(self, s: float) -> None:
        with self.lock:
            self.now += s


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(device_turns, "time", fake)
    return fake


def busy(turns: DeviceTurns, clock: FakeClock, name: str, stop: threading.Event, order: list[str], inside: list[int], step_s: float = STEP_S,
         peers: tuple[str, ...] = ()) -> None:
    """Take turns until ``stop``: each holds the device for ``step_s`` on ``clock``, recorded in ``order``.

    ``peers``: parties that are busy too; a step ends only once each of them is waiting (or 1 s has
    passed), so every release finds them asking -- the "both have work" of the share tests, which a
    loaded host would otherwise break by descheduling a peer's thread between two of its turns (the
    other party then, rightly, takes turns alone)."""
    while not stop.is_set():
        with turns.turn(name):
            inside[0] += 1
            assert inside[0] == 1, "two parties inside their turns at once"
            order.append(name)
            clock.advance(step_s)
            time.sleep(0)  # let the other thread run (it may try to take the device: it must wait)
            until = time.monotonic() + 1.0
            while peers and not set(peers) <= turns.waiting and not stop.is_set() and time.monotonic() < until:
                time.sleep(0.0001)
            inside[0] -= 1


def run_parties(turns: DeviceTurns, clock: FakeClock, names: list[str], total_turns: int, steps: dict[str, float] | None = None,
                order: list[str] | None = None) -> list[str]:
    """Every party in ``names`` busy until ``total_turns`` more turns have been taken."""
    stop, order, inside = threading.Event(), order if order is not None else [], [0]
    target = len(order) + total_turns
    threads = [threading.Thread(target=busy, args=(turns, clock, n, stop, order, inside, (steps or {}).get(n, STEP_S), tuple(set(names) - {n})))
               for n in names]
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
    turns = DeviceTurns(shares, anticipate_s=BUSY_ANTICIPATE_S)
    run_parties(turns, clock, list(shares), 400)
    total = sum(turns.used_s.values())
    for name, share in shares.items():
        # over a stretch where both have work, device time follows the shares to within a step or two
        assert turns.used_s[name] / total == pytest.approx(share, abs=0.02), turns.used_s


def test_unequal_steps_still_split_device_time_by_share(clock):
    """A party with long steps (an SD iteration) against one with short ones (a verify pass): the
    shares hold for device *time*, not for the number of turns."""
    turns = DeviceTurns({"engine": 0.5, "ed": 0.5}, anticipate_s=BUSY_ANTICIPATE_S)
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
    turns = DeviceTurns({"engine": 0.5, "ed": 0.5}, anticipate_s=BUSY_ANTICIPATE_S)
    order = run_parties(turns, clock, ["engine"], 200)  # 'ed' idle: it falls 200 steps behind in used time
    ed_from = len(order)
    run_parties(turns, clock, ["engine", "ed"], 100, order=order)
    after = order[ed_from:]
    window = after[after.index("ed"):][:40]
    # equal shares and steps: about every other turn; a banked credit would give 'ed' all 40
    assert 16 <= window.count("ed") <= 24, window


def test_share_changes_apply_to_the_next_turns(clock):
    turns = DeviceTurns({"engine": 0.5, "ed": 0.5}, anticipate_s=BUSY_ANTICIPATE_S)
    run_parties(turns, clock, ["engine", "ed"], 200)
    before = dict(turns.used_s)
    turns.set_shares({"engine": 0.2, "ed": 0.8})
    run_parties(turns, clock, ["engine", "ed"], 500)
    used = {n: turns.used_s[n] - before[n] for n in before}
    assert used["ed"] / sum(used.values()) == pytest.approx(0.8, abs=0.03), used


def take_turn_in_thread(turns: DeviceTurns, name: str) -> tuple[threading.Event, threading.Thread]:
    """A started thread that takes one turn of ``name``; the event is set once it has the device."""
    got = threading.Event()

    def take():
        with turns.turn(name):
            got.set()

    t = threading.Thread(target=take)
    t.start()
    return got, t


def test_a_fault_inside_a_turn_releases_the_device():
    turns = DeviceTurns({"engine": 1.0, "ed": 1.0})
    with pytest.raises(ZeroDivisionError), turns.turn("ed"):
        raise ZeroDivisionError("a fault in a verification pass")
    done, t = take_turn_in_thread(turns, "engine")
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
    got, o = take_turn_in_thread(turns, "sd")
    release.set()
    t.join(5)
    o.join(5)
    assert got.is_set()


def gapped(turns: DeviceTurns, clock: FakeClock, name: str, stop: threading.Event, order: list[str], step_s: float, gap_s: float,
           peers: tuple[str, ...] = ()) -> None:
    """Take turns until ``stop`` with a real pause of ``gap_s`` after each (the batcher's own work between
    passes); ``peers`` as in :func:`busy` (each release finds them asking)."""
    while not stop.is_set():
        with turns.turn(name):
            order.append(name)
            clock.advance(step_s)
            until = time.monotonic() + 1.0
            while peers and not set(peers) <= turns.waiting and not stop.is_set() and time.monotonic() < until:
                time.sleep(0.0001)
        time.sleep(gap_s)


@pytest.mark.parametrize("anticipate_s, holds", [(0.25, True), (0.0, False)])
def test_a_party_with_short_gaps_keeps_its_share_by_anticipation(clock, anticipate_s, holds):
    """The verifier's 1 ms passes with a short pause between them against 4 ms engine steps at ED
    share 0.8: held for it while it is behind, it gets its share; without anticipation every pause
    lets a whole engine step in and the two alternate (0.2 of the device, whatever the share)."""
    turns = DeviceTurns({"engine": 0.2, "ed": 0.8}, anticipate_s=anticipate_s)
    stop, order, inside = threading.Event(), [], [0]
    threads = [threading.Thread(target=busy, args=(turns, clock, "engine", stop, order, inside, 0.004)),
               threading.Thread(target=gapped, args=(turns, clock, "ed", stop, order, 0.001, 0.0003, ("engine",)))]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while len(order) < 400 and time.monotonic() < deadline:
        time.sleep(0.005)
    stop.set()
    for t in threads:
        t.join(10)
    share = turns.used_s["ed"] / sum(turns.used_s.values())
    if holds:
        assert share == pytest.approx(0.8, abs=0.05), turns.used_s
    else:
        assert share < 0.5, turns.used_s


def test_time_charged_at_a_tiny_share_does_not_lock_a_party_out_after_it_grows(clock):
    """One 20 ms pass at share 0.01 puts the verifier 2 s of virtual time ahead; after its share
    becomes 0.5 it is rescaled to 40 ms ahead, not 2 s (which would take the engine 1 s of device)."""
    turns = DeviceTurns({"engine": 0.99, "ed": 0.01}, anticipate_s=0.0)
    with turns.turn("ed"):
        clock.advance(0.020)
    turns.set_shares({"engine": 0.5, "ed": 0.5})
    order = run_parties(turns, clock, ["engine", "ed"], 300)
    assert order.count("ed") >= 100, order.count("ed")


def test_the_device_held_for_a_party_that_does_not_come_back_is_released(clock):
    """Anticipation is bounded: a party behind its share that goes idle holds the others back for
    ``anticipate_s`` at most, then they go on."""
    turns = DeviceTurns({"engine": 0.1, "ed": 0.9}, anticipate_s=0.05)
    with turns.turn("engine"):
        clock.advance(0.001)
    got = []

    def engine_again():
        t0 = time.monotonic()
        with turns.turn("engine"):
            got.append(time.monotonic() - t0)

    waiter = threading.Thread(target=engine_again)
    with turns.turn("ed"):  # 'ed' behind (0.0011 against 0.01 of virtual time): held for it when it ends
        waiter.start()
        while "engine" not in turns.waiting:
            time.sleep(0.001)
        clock.advance(0.001)
    waiter.join(5)
    assert got and 0.04 <= got[0] < 2.0


# ------------------------------------------------------------------ the turns' users: shutdown paths
def hold_turn(turns: DeviceTurns, name: str) -> tuple[threading.Event, threading.Thread]:
    """A thread holding ``name``'s turn until the returned event is set."""
    held, release = threading.Event(), threading.Event()

    def hold():
        with turns.turn(name):
            held.set()
            release.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    assert held.wait(5)
    return release, t


def test_a_round_cancelled_while_it_waits_for_its_turn_runs_no_step():
    from runtime.executor import Cancelled

    turns = DeviceTurns({"engine": 1.0, "ed": 1.0}, anticipate_s=0.0)
    release, holder = hold_turn(turns, "ed")
    cancel, stepped, raised = threading.Event(), [], []

    def steps():
        stepped.append(1)
        yield
        return 1

    def round_thread():
        try:
            run_shared({"sd": (steps(), 1.0)}, cancel=cancel, turns=turns)
        except Cancelled as exc:
            raised.append(exc)

    t = threading.Thread(target=round_thread)
    t.start()
    while "engine" not in turns.waiting:
        time.sleep(0.001)
    cancel.set()
    release.set()
    t.join(5)
    holder.join(5)
    assert raised and not stepped


class RecordingVerifier:
    """The batcher's verifier, minus the model: records the batches it verifies."""

    vocab_size = 100

    def __init__(self):
        self.batches = []

    def check(self, req) -> None:
        pass

    def release(self, client: str) -> bool:
        return True

    def verify(self, requests):
        from runtime.split.verifier import Verdict

        self.batches.append(requests)
        return [Verdict(0, 1, 1) for _ in requests]


def test_a_batcher_stopped_while_it_waits_for_its_turn_fails_the_batch_unverified():
    from runtime.split.batcher import VerificationBatcher
    from runtime.split.verifier import VerifyRequest

    turns = DeviceTurns({"engine": 1.0, "ed": 1.0}, anticipate_s=0.0)
    verifier = RecordingVerifier()
    batcher = VerificationBatcher(verifier, window_s=0.0, turns=turns, party="ed")
    release, holder = hold_turn(turns, "engine")
    batcher.join("c")
    fut = batcher.submit(VerifyRequest("c", (1,), (2, 3), 2))
    while "ed" not in turns.waiting:
        time.sleep(0.001)
    batcher.stop(timeout=0.05)  # the batcher thread still waits for its turn
    release.set()
    holder.join(5)
    with pytest.raises(RuntimeError, match="stopped"):
        fut.result(5)
    assert verifier.batches == []
