"""The batched draft device (runtime.split.batched_drafter): its drafts equal the model's own
forward's (DraftSession) under any order of proposals, speculation, rollbacks, slot reuse and pool
growth, for many sessions drafting at once; rows really share steps; stop(), failures and close()
end each request with an outcome and leave the device serving."""

import random
import threading
import time
import types

import pytest
import torch
from tiny_models import tiny, tiny_trio

from runtime.engines import generate_ad
from runtime.split.batched_drafter import BatchedDrafter, check_supported
from runtime.split.batcher import VerificationBatcher
from runtime.split.drafter import DraftSession
from runtime.split.edge_client import EdgeClient
from runtime.split.transport import LocalLink
from runtime.split.verifier import BatchVerifier


@pytest.fixture(scope="module")
def draft():
    return tiny(2, 32, seed=5)  # two layers: the pool's per-layer KV is exercised


def script(seed: int, steps: int = 12):
    """A random sequence of (depth, extra proactive tokens, accepted, bonus-is-the-guess)."""
    rng = random.Random(seed)
    out = []
    for _ in range(steps):
        d = rng.randrange(1, 6)
        out.append((d, rng.randrange(0, d + 2), rng.randrange(0, d + 1), rng.random() < 0.5, rng.randrange(40)))
    return [rng.randrange(40) for _ in range(rng.randrange(1, 30))], out


def play(session, prompt_and_ops, speculative: bool = False) -> list[list[int]]:
    """Run a script on a session; the chains it drafted, in order (the comparison's record).
    ``speculative``: the extra tokens are drafted as proactive drafting drafts them."""
    _, ops = prompt_and_ops
    record = []
    for d, extra, accepted, guess, other in ops:
        session.propose(d)
        session.extend(len(session.chain) + extra, speculative=speculative)
        record.append(list(session.chain))
        bonus = session.chain[accepted] if guess and len(session.chain) > accepted else other
        session.commit(d, accepted, bonus)
    record.append(list(session.tokens))
    return record


def gate_steps(device, monkeypatch):
    gate, entered, sizes = threading.Event(), threading.Event(), []
    step = device._step

    def gated(batch):
        sizes.append(len(batch))
        entered.set()
        gate.wait(10)
        return step(batch)

    monkeypatch.setattr(device, "_step", gated)
    return gate, entered, sizes


def busy_with(device, entered, prompt=(1, 2, 3)):
    """Start a session drafting one token and wait until its (gated) step holds the device;
    returns the session and its thread."""
    session = device.session(list(prompt))
    thread = threading.Thread(target=session.extend, args=(1,))
    thread.start()
    assert entered.wait(10)
    return session, thread


@pytest.mark.parametrize(("initial_capacity", "speculation_yields"), [(4, False), (256, False), (4, True)])
def test_drafts_equal_the_models_own_forward_with_many_sessions_at_once(draft, initial_capacity, speculation_yields):
    scripts = [script(seed) for seed in range(10)]
    expected = [play(DraftSession(draft, s[0]), s) for s in scripts]
    device = BatchedDrafter(draft, initial_capacity=initial_capacity, speculation_yields=speculation_yields)  # 4: the pool grows mid-run
    got = [None] * len(scripts)

    def run(i):
        session = device.session(scripts[i][0])
        got[i] = play(session, scripts[i], speculative=i % 2 == 0)  # half the sessions' extra tokens are speculative
        session.close()

    try:
        for _ in range(2):  # the second round reuses the first round's slots
            threads = [threading.Thread(target=run, args=(i,)) for i in range(len(scripts))]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            assert got == expected
    finally:
        device.close()
    assert device.rows > device.steps  # sessions shared steps


def test_waiting_sessions_join_one_step(draft, monkeypatch):
    device = BatchedDrafter(draft)
    gate, entered, sizes = gate_steps(device, monkeypatch)
    first, t0 = busy_with(device, entered)  # the device is busy with the first row's step
    others = [device.session([4 + i]) for i in range(4)]
    threads = [threading.Thread(target=s.extend, args=(3,)) for s in others]
    for t in threads:
        t.start()
    while device.queued < 4:
        time.sleep(0.001)
    gate.set()
    for t in [t0, *threads]:
        t.join(10)
    device.close()
    assert sizes[:4] == [1, 4, 4, 4]  # the four waiting sessions' blocks ran together, three steps
    assert all(len(s.chain) == 3 for s in others) and len(first.chain) == 1
    assert all(s.wait_seconds > 0 for s in others)


def record_step_kinds(device, monkeypatch):
    """Gate the device's steps (as gate_steps) and record each step's rows as ``speculative`` flags."""
    gate, entered, kinds = threading.Event(), threading.Event(), []
    step = device._step

    def gated(batch):
        kinds.append([row.speculative for row in batch])
        entered.set()
        gate.wait(10)
        return step(batch)

    monkeypatch.setattr(device, "_step", gated)
    return gate, entered, kinds


def speculating_then_on_demand(device, monkeypatch):
    """A session drafts 8 speculative tokens; while its first step runs, another asks for a block
    of 3 on demand. Returns the steps' kinds and the two sessions."""
    gate, entered, kinds = record_step_kinds(device, monkeypatch)
    spec = device.session([1, 2, 3])
    t_spec = threading.Thread(target=spec.extend, args=(8,), kwargs={"speculative": True})
    t_spec.start()
    assert entered.wait(10)
    demand = device.session([4, 5])
    t_demand = threading.Thread(target=demand.extend, args=(3,))
    t_demand.start()
    wait_until(lambda: device.queued >= 1)
    gate.set()
    t_spec.join(10), t_demand.join(10)
    device.close()
    return kinds, spec, demand


def test_speculative_rows_yield_to_on_demand_rows(draft, monkeypatch):
    """speculation_yields: while an on-demand block is being drafted the speculating row sits out,
    and it resumes once no on-demand row waits; both chains are the model's own."""
    device = BatchedDrafter(draft, speculation_yields=True)
    kinds, spec, demand = speculating_then_on_demand(device, monkeypatch)
    assert kinds == [[True], [False], [False], [False], *[[True]] * 7]
    assert device.yielded == 3 and device.rows == device.steps == 11
    assert spec.chain == DraftSession(draft, [1, 2, 3]).propose(8)
    assert demand.chain == DraftSession(draft, [4, 5]).propose(3)


def test_without_yielding_both_kinds_share_every_step(draft, monkeypatch):
    """The default: every row in every step."""
    device = BatchedDrafter(draft)
    kinds, spec, demand = speculating_then_on_demand(device, monkeypatch)
    assert kinds == [[True], [True, False], [True, False], [True, False], *[[True]] * 4]
    assert device.yielded == 0 and device.rows == 11 and device.steps == 8
    assert spec.chain == DraftSession(draft, [1, 2, 3]).propose(8)
    assert demand.chain == DraftSession(draft, [4, 5]).propose(3)


def wait_until(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def test_a_held_back_row_stops_on_its_verdict_and_counts_its_wait(draft, monkeypatch):
    """A speculative row sitting out an on-demand step ends at that step's end once its stop() is
    true (its caller waits on the verdict, not on the device); the step it sat out is its session's
    held time. Without yielding it would have drafted a second token in that step."""
    device = BatchedDrafter(draft, speculation_yields=True)
    permits, kinds, step = threading.Semaphore(0), [], device._step

    def one_at_a_time(batch):
        kinds.append([row.speculative for row in batch])
        assert permits.acquire(timeout=10)
        return step(batch)

    monkeypatch.setattr(device, "_step", one_at_a_time)
    verdict = threading.Event()
    spec, demand = device.session([1, 2, 3]), device.session([4, 5])
    t_spec = threading.Thread(target=spec.extend, args=(50,), kwargs={"stop": verdict.is_set, "speculative": True})
    t_spec.start()
    wait_until(lambda: len(kinds) == 1)  # the speculative row's first step is running
    t_demand = threading.Thread(target=demand.extend, args=(3,))
    t_demand.start()
    wait_until(lambda: device.queued == 1)
    permits.release()
    wait_until(lambda: len(kinds) == 2)  # the on-demand row's first step: the speculative row sits it out
    assert kinds == [[True], [False]]
    verdict.set()
    permits.release(10)
    t_spec.join(10), t_demand.join(10)
    device.close()
    assert not t_spec.is_alive() and len(spec.chain) == 1 and len(demand.chain) == 3
    assert 0 < spec.held_seconds <= spec.wait_seconds and demand.held_seconds == 0


def test_a_device_full_of_speculative_rows_still_takes_a_block(draft):
    """While yielding, max_batch counts on-demand rows only: with max_batch 1 and a speculative
    row drafting, an on-demand block still joins and finishes first."""
    device = BatchedDrafter(draft, max_batch=1, speculation_yields=True)
    stop = threading.Event()
    spec, demand = device.session([1, 2, 3]), device.session([4, 5])
    t_spec = threading.Thread(target=spec.extend, args=(3000,), kwargs={"stop": stop.is_set, "speculative": True})
    t_spec.start()
    wait_until(lambda: spec.draft_steps >= 2)
    demand.extend(3)  # would wait for the speculative row's 3000 tokens (seconds) if it counted against max_batch
    assert t_spec.is_alive() and len(demand.chain) == 3
    stop.set()
    t_spec.join(10)
    device.close()
    assert not t_spec.is_alive()


def test_held_time_is_not_drafting_time_for_the_depth_controller(monkeypatch):
    """EdgeClient's per-token draft time (the depth controller's input) leaves out the steps a
    yielding device held its proactive drafting back for others' blocks."""
    from fake_links import AcceptAllLink

    from runtime.split import edge_client
    from runtime.split.depth import DepthController
    from runtime.split.drafter import DraftChain

    class HeldSession(DraftChain):
        def extend(self, upto, stop=None, speculative=False):
            while len(self.chain) < upto:
                self.record_draft(7)
                self.draft_seconds += 0.002
            if speculative:  # sat out 1 s of others' steps meanwhile
                self.draft_seconds += 1.0
                self.held_seconds += 1.0
                self.wait_seconds += 1.0

    class Recording(DepthController):
        def observe(self, draft_s_per_token, *args, **kwargs):
            seen.append(draft_s_per_token)
            return super().observe(draft_s_per_token, *args, **kwargs)

    seen = []
    monkeypatch.setattr(edge_client, "DraftSession", lambda draft, prompt: HeldSession(prompt))
    client = edge_client.EdgeClient(None, AcceptAllLink(compute_ms=1.0), depth=Recording(1, 4, initial=2), proactive=True)
    out = client.generate([1, 2], 12)
    assert out.outcome == "length" and len(seen) >= 2
    assert all(t == pytest.approx(0.002) for t in seen if t is not None)  # not ~0.2 s a token
    assert all(log.proactive_ms < 100 for log in out.iterations)


def test_edge_clients_draft_proactively_as_speculative_rows():
    """EdgeClient marks its proactive drafting speculative (its on-demand blocks not), so the
    batched device can hold it back; the output stays greedy AD's."""
    target, close, _ = tiny_trio(max_positions=512)
    batcher = VerificationBatcher(BatchVerifier(target), window_s=0.002)
    device = BatchedDrafter(close)
    flags, submit = [], device._submit
    device._submit = lambda session, upto, stop, speculative=False: (flags.append((stop is not None, speculative)), submit(session, upto, stop, speculative))[1]
    edge = EdgeClient(close, LocalLink(batcher), depth=3, proactive=True, draft_device=device)
    out = edge.generate([1, 2, 3], 16)
    assert out.tokens == generate_ad(target, [[1, 2, 3]], [16]).tokens[0]
    assert (False, False) in flags and (True, True) in flags and all(spec == has_stop for has_stop, spec in flags)
    edge.link.close()
    batcher.stop()
    device.close()


def test_stop_ends_a_speculating_row_within_a_step(draft):
    device = BatchedDrafter(draft)
    session = device.session([1, 2, 3])
    calls = []

    def stop():
        calls.append(len(session.chain))
        return len(session.chain) >= 2

    session.extend(50, stop=stop)
    assert len(session.chain) == 2 and calls[-1] == 2
    session.extend(1)  # already long enough: returns at once
    assert len(session.chain) == 2
    device.close()


def test_a_failing_stop_or_step_fails_only_its_requests(draft, monkeypatch):
    device = BatchedDrafter(draft)
    a, b = device.session([1, 2]), device.session([3, 4])

    def boom():
        raise KeyError("stop failed")

    with pytest.raises(KeyError):
        a.extend(5, stop=boom)
    step, failures = device._step, [RuntimeError("forward failed")]

    def flaky(batch):
        if failures:
            raise failures.pop()
        return step(batch)

    monkeypatch.setattr(device, "_step", flaky)
    with pytest.raises(RuntimeError, match="forward failed"):
        b.extend(2)
    b.extend(2)  # the device serves on
    assert len(b.chain) == 2
    a.close(), b.close()
    device.close()


def test_close_fails_what_is_queued_and_refuses_new_work(draft, monkeypatch):
    device = BatchedDrafter(draft)
    gate = threading.Event()
    step = device._step
    monkeypatch.setattr(device, "_step", lambda batch: (gate.wait(10), step(batch))[1])
    s = device.session([1, 2, 3])
    errors = []

    def run():
        try:
            s.extend(3)
        except RuntimeError as exc:
            errors.append(str(exc))

    t = threading.Thread(target=run)
    t.start()
    closer = threading.Thread(target=device.close)
    closer.start()
    gate.set()
    t.join(10), closer.join(10)
    assert errors and "closed" in errors[0]
    with pytest.raises(RuntimeError, match="closed"):
        device.session([1])
    s.close(), s.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        s.extend(9)


def test_only_llama_drafts_are_batched():
    fake = types.SimpleNamespace(config=types.SimpleNamespace(model_type="gpt2"))
    with pytest.raises(ValueError, match="model_type.*shared-device on"):
        check_supported(fake)
    with pytest.raises(ValueError, match="max_batch"):
        BatchedDrafter(tiny(1, 16), max_batch=0)


def test_float32_logits_track_the_models_forward():
    """In float32 the batched attention is not bit-identical to the model's; its argmax still
    follows the model's on every step of a long greedy run (ties are rare, never lossy)."""
    model = tiny(1, 32, seed=9, dtype=torch.float32)
    device = BatchedDrafter(model)
    for seed in range(4):
        rng = random.Random(seed)
        prompt = [rng.randrange(40) for _ in range(rng.randrange(1, 20))]
        ours, theirs = device.session(prompt), DraftSession(model, prompt)
        assert ours.propose(40) == theirs.propose(40)
        ours.close()
    device.close()


def test_lossless_check_covers_the_batched_draft_device(tmp_path):
    """runtime.split.lossless_check (scripts/gpu_check.sh runs it on CUDA) on the tiny pair: greedy
    AD, SD, the split and the split on one batched draft device all agree."""
    import json

    from runtime.split import lossless_check

    out = tmp_path / "lossless.json"
    with pytest.raises(SystemExit) as done:
        lossless_check.main(["--preset", "tiny", "--out", str(out), "--max-new-tokens", "8", "--clients", "3"])
    assert done.value.code == 0
    checks = json.loads(out.read_text())["checks"]
    assert set(checks) == {"ad_batched", "sd_batched", "split", "split_batched_drafts"}
    assert all(c["failures"] == [] and c["identical"] == 10 for c in checks.values())


def test_prompts_of_different_lengths_share_one_step(draft, monkeypatch):
    device = BatchedDrafter(draft)
    gate, entered, sizes = gate_steps(device, monkeypatch)
    _, t0 = busy_with(device, entered, [1])
    prompts = [[3, 1], [5, 6, 7, 8, 9, 10, 11], [2, 4, 6], [9, 8, 7, 6, 5]]
    sessions = [device.session(p) for p in prompts]
    threads = [threading.Thread(target=s.extend, args=(4,)) for s in sessions]
    for t in threads:
        t.start()
    while device.queued < len(prompts):
        time.sleep(0.001)
    gate.set()
    for t in [t0, *threads]:
        t.join(10)
    device.close()
    assert sizes[1] == len(prompts)  # four padded prompt rows in one forward
    assert [s.chain for s in sessions] == [DraftSession(draft, p).propose(4) for p in prompts]


def test_the_device_feeds_each_token_once(draft):
    device = BatchedDrafter(draft)
    s = device.session([1, 2, 3, 4])
    s.extend(3)
    assert s.fed == len(s.tokens) + len(s.chain) - 1 == 6  # every token but the last draft
    assert s.draft_steps == 3
    device.close()


def test_a_closed_sessions_slot_is_reused(draft):
    device = BatchedDrafter(draft)
    a = device.session([1, 2])
    a.extend(2)
    a.close()
    assert device.session([3]).slot == a.slot
    device.close()


def test_close_waits_for_the_step_carrying_its_session(draft, monkeypatch):
    device = BatchedDrafter(draft)
    gate, entered, _ = gate_steps(device, monkeypatch)
    s, t = busy_with(device, entered)
    closer = threading.Thread(target=s.close)
    closer.start()
    closer.join(0.2)
    assert closer.is_alive() and s.slot not in device._free_slots  # the step still writes into the slot
    gate.set()
    t.join(10), closer.join(10)
    assert s.slot in device._free_slots
    device.close()


def test_max_batch_caps_every_step(draft, monkeypatch):
    device = BatchedDrafter(draft, max_batch=2)
    sizes, step = [], device._step
    monkeypatch.setattr(device, "_step", lambda batch: (sizes.append(len(batch)), step(batch))[1])
    sessions = [device.session([i + 1]) for i in range(5)]
    threads = [threading.Thread(target=s.extend, args=(4,)) for s in sessions]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    device.close()
    assert all(len(s.chain) == 4 for s in sessions) and max(sizes) == 2


def test_wait_is_counted_once_per_request(draft, monkeypatch):
    device = BatchedDrafter(draft)
    gate, entered, _ = gate_steps(device, monkeypatch)
    _, t0 = busy_with(device, entered)
    s = device.session([4])
    t = threading.Thread(target=s.extend, args=(4,))
    t.start()
    time.sleep(0.1)  # s waits ~0.1 s for the running step, once
    gate.set()
    t0.join(10), t.join(10)
    device.close()
    assert 0.09 < s.wait_seconds <= s.draft_seconds


def test_a_failed_pool_growth_leaves_the_device_serving(draft, monkeypatch):
    device = BatchedDrafter(draft, initial_capacity=4)
    a = device.session([1, 2, 3])
    a.extend(1)  # the pool exists: 8 slots of 4 positions
    zeros, calls = torch.zeros, []

    def oom_on_second_layer(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("out of memory (injected)")
        return zeros(*args, **kwargs)

    monkeypatch.setattr(torch, "zeros", oom_on_second_layer)
    b = device.session(list(range(1, 10)))  # 9 tokens: the pool must grow
    with pytest.raises(RuntimeError, match="out of memory"):
        b.extend(1)
    monkeypatch.setattr(torch, "zeros", zeros)
    c = device.session([5, 6])
    c.extend(2)  # a later step, no growth needed: must still work
    assert c.chain == DraftSession(draft, [5, 6]).propose(2)
    a.extend(4)  # needs growth again (3 + 4 > 4 positions): must work and keep a's KV
    assert a.chain == DraftSession(draft, [1, 2, 3]).propose(4)
    device.close()


def test_an_empty_prompt_does_not_leak_a_slot(draft):
    device = BatchedDrafter(draft)
    with pytest.raises(ValueError):
        device.session([])
    assert device.session([1]).slot == 0
    device.close()


def test_requests_give_their_slots_back_and_a_closed_device_is_an_outcome():
    target, close, _ = tiny_trio(max_positions=512)
    batcher = VerificationBatcher(BatchVerifier(target), window_s=0.002)
    device = BatchedDrafter(close)
    edge = EdgeClient(close, LocalLink(batcher), depth=3, proactive=True, draft_device=device)
    for prompt in ([1, 2, 3], [4, 5], [6]):
        out = edge.generate(prompt, 12)
        assert out.tokens == generate_ad(target, [prompt], [12]).tokens[0]
    assert device._next_slot == 1 and device._free_slots == [0]  # one slot, reused, given back
    edge.link.close()
    batcher.stop()


def test_a_closed_device_ends_a_request_with_an_outcome():
    target, close, _ = tiny_trio(max_positions=512)
    batcher = VerificationBatcher(BatchVerifier(target), window_s=0.002)
    device = BatchedDrafter(close)
    edge = EdgeClient(close, LocalLink(batcher), depth=3, draft_device=device)
    device.close()
    out = edge.generate([1, 2, 3], 5)  # must end with an outcome, not raise
    assert out.outcome == "error" and "closed" in out.error
    edge.link.close()
    batcher.stop()


def test_closing_a_session_ends_its_running_row_at_the_next_step(draft):
    """A caller interrupted mid-draft closes its session: the row stops within a step and the
    slot is given back only after it (never written by the next owner's predecessor)."""
    device = BatchedDrafter(draft)
    s = device.session([1, 2, 3])
    t = threading.Thread(target=s.extend, args=(10_000,))
    t.start()
    while s.draft_steps < 3:
        time.sleep(0.001)
    s.close()
    t.join(10)
    assert not t.is_alive() and 3 <= len(s.chain) < 10_000 and s.slot in device._free_slots
    device.close()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_device_thread_fails_its_waiters_instead_of_hanging(draft):
    device = BatchedDrafter(draft)
    s = device.session([1, 2])

    def fatal():
        if threading.current_thread() is device._thread:  # (the caller asks once too, before submitting)
            raise SystemExit("the device thread dies")  # not an Exception: nothing in the loop catches it
        return False

    with pytest.raises(RuntimeError, match="stopped"):
        s.extend(3, stop=fatal)
    assert not device._thread.is_alive()


def test_the_edge_process_builds_its_device_with_the_priority_asked_for(draft):
    from runtime.edge import make_draft_device

    for priority, yields in (("equal", False), ("yield", True)):
        device = make_draft_device("batched", draft, priority)
        assert isinstance(device, BatchedDrafter) and device.speculation_yields is yields
        device.close()
    with pytest.raises(ValueError, match="proactive_priority"):
        make_draft_device("batched", draft, "first")
