"""Split runtime I: the edge drafter, batched server verification, the batcher's cohorts, the depth
controller -- lossless against greedy AD and the target's sampling law, over the in-process link."""

import random
import threading

import numpy as np
import pytest
import torch
from scipy import stats
from tiny_models import tiny, tiny_trio

from runtime.engines import generate_ad
from runtime.split.acceptance import accepted_length, emitted
from runtime.split.batched_drafter import BatchedDrafter
from runtime.split.batcher import VerificationBatcher
from runtime.split.depth import DepthController
from runtime.split.draft_device import SharedDraftDevice
from runtime.split.drafter import DraftSession
from runtime.split.edge_client import EdgeClient
from runtime.split.messages import Reply
from runtime.split.transport import DelayedLink, LocalLink
from runtime.split.verifier import BatchVerifier, InvalidRequest, VerifyRequest


@pytest.fixture(scope="module")
def models():
    return tiny_trio(max_positions=512)  # the verifier's length checks are tested at this limit


def test_acceptance_rule():
    assert emitted([], [7]) == (0, 7)
    assert emitted([1, 2, 3], [1, 2, 3, 4]) == (3, 4)
    assert emitted([1, 2, 3], [1, 5, 3, 4]) == (1, 5)
    assert accepted_length([9], [1, 9]) == 0  # a later match after a miss does not count
    with pytest.raises(ValueError):
        accepted_length([1, 2], [1, 2])


def run_clients(target, draft, jobs, cohorts=1, depth=3, proactive=True, temperature=0.0, window_s=0.002, bucket=None, shared_device=None):
    """Each job ``(prompts, limits)`` is one edge client serving its requests in order, all at once;
    ``shared_device``: None (each its own), "on" (one after another) or "batched"."""
    batcher = VerificationBatcher(BatchVerifier(target, bucket=bucket), cohorts=cohorts, window_s=window_s)
    results = [None] * len(jobs)
    device = {None: None, "on": SharedDraftDevice(), "batched": BatchedDrafter(draft)}[shared_device]

    def client(i):
        edge = EdgeClient(draft, LocalLink(batcher), depth=depth, proactive=proactive, draft_device=device)
        results[i] = [edge.generate(p, n, temperature=temperature, seed=1000 * i + k) for k, (p, n) in enumerate(zip(*jobs[i], strict=True))]
        edge.link.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    batcher.stop()
    if isinstance(device, BatchedDrafter):
        device.close()
    return results, batcher


@pytest.mark.parametrize("seed", range(4))
def test_greedy_split_equals_greedy_ad(models, seed):
    target, close, far = models
    rng = random.Random(seed)
    n_clients = [1, 2, 5, 8][seed]
    jobs = []
    for _ in range(n_clients):
        prompts = [[rng.randrange(1, 40) for _ in range(rng.randint(1, 12))] for _ in range(rng.randint(1, 2))]
        jobs.append((prompts, [rng.randint(1, 20) for _ in prompts]))
    for draft, depth, proactive, cohorts, shared in ((close, 1 + seed, True, 1, None), (far, 4 - seed % 3, False, 2, "on"),
                                                     (close, DepthController(initial=2), True, 2, "on"),
                                                     (close, 2 + seed % 3, seed % 2 == 0, 1 + seed % 2, "batched"),
                                                     (far, DepthController(initial=3), True, 1, "batched")):
        results, batcher = run_clients(target, draft, jobs, cohorts=cohorts, depth=depth, proactive=proactive, shared_device=shared)
        for (prompts, limits), outs in zip(jobs, results, strict=True):
            assert [o.tokens for o in outs] == generate_ad(target, prompts, limits).tokens, (seed, depth, proactive)
            assert all(o.outcome == "length" for o in outs)
        assert batcher.verifier.sessions == {}  # every finished request freed its state


@pytest.mark.parametrize("bucket", [8, 64])
def test_shape_buckets_do_not_change_outputs(models, bucket):
    target, close, _ = models
    jobs = [([[1, 2, 3], [7] * 11], [18, 9]), ([[5, 6]], [20]), ([[9, 8, 7, 6, 5]], [14])]
    results, _ = run_clients(target, close, jobs, cohorts=1, depth=3, bucket=bucket)
    for (prompts, limits), outs in zip(jobs, results, strict=True):
        assert [o.tokens for o in outs] == generate_ad(target, prompts, limits).tokens


def test_proactive_hits_with_an_identical_draft(models):
    target, _, _ = models
    (outs,), _ = run_clients(target, target, [([[1, 2, 3]], [40])], depth=3, proactive=True)
    logs = outs[0].iterations
    assert all(log.accepted == log.depth for log in logs)
    assert any(log.proactive_hit for log in logs[:-1])  # a draft equal to the target always guesses the bonus


def test_drafter_rolls_back_to_the_committed_text(models):
    _, close, _ = models
    s = DraftSession(close, [4, 5, 6])
    chain = s.propose(4)
    for _ in range(3):
        s.draft_one()  # proactive: beyond the block
    bonus = (chain[1] + 1) % 40
    assert not s.commit(4, 1, bonus)
    assert s.tokens == [4, 5, 6, chain[0], bonus] and s.chain == [] and s.fed == len(s.tokens) - 1
    assert s.cache.get_seq_length() == s.fed
    fresh = DraftSession(close, s.tokens)
    assert s.propose(3) == fresh.propose(3)  # the cropped cache drafts exactly what a fresh one does


def test_sampling_split_matches_target_distribution():
    """Chi-square on the joint law of the first two tokens, vocabulary of 6 (sample-and-match)."""
    v, prompt, n = 6, [1, 2, 3], 3000
    target, draft = tiny(1, 16, vocab=v, seed=3), tiny(1, 16, vocab=v, seed=4)
    verifier = BatchVerifier(target)
    counts = np.zeros((v, v))
    for start in range(0, n, 500):  # 500 users per batch, each with its own seed
        sessions = [DraftSession(draft, prompt) for _ in range(500)]
        reqs = [VerifyRequest(f"u{start + i}", tuple(s.propose(2 if i % 2 else 1)), tuple(prompt), 3, 1.0, start + i) for i, s in enumerate(sessions)]
        for s, r, res in zip(sessions, reqs, verifier.verify(reqs), strict=True):
            s.commit(len(r.drafts), res.accepted, res.bonus)
            if len(s.tokens) < 5:  # one token so far: verify one more step (no drafts)
                (res2,) = verifier.verify([VerifyRequest(r.client, (), (), len(s.tokens), 1.0)])
                s.commit(0, 0, res2.bonus)
            counts[s.tokens[3], s.tokens[4]] += 1
    with torch.no_grad():
        p1 = torch.softmax(target(torch.tensor([prompt])).logits[0, -1].double(), -1)
        joint = np.stack([(p1[a] * torch.softmax(target(torch.tensor([prompt + [a]])).logits[0, -1].double(), -1)).numpy() for a in range(v)])
    _, pvalue = stats.chisquare(counts.ravel(), joint.ravel() * n)
    assert pvalue > 1e-3, pvalue


def test_row_errors_do_not_fail_the_batch(models):
    target, close, _ = models
    verifier = BatchVerifier(target, max_depth=4)
    good = VerifyRequest("a", (1, 2), (3, 4), 2)
    res = verifier.verify([good, VerifyRequest("b", (1,), (), 5)])
    assert res[0].committed >= 3 and isinstance(res[1], InvalidRequest)
    stale = VerifyRequest("a", (1,), (), 99)
    assert isinstance(verifier.verify([stale])[0], InvalidRequest)
    for bad in (VerifyRequest("a", (40,), (1,), 1), VerifyRequest("a", (1,) * 5, (1,), 1), VerifyRequest("a", (), (1, 2), 5),
                VerifyRequest("a", (), (), 0), VerifyRequest("a", (), (1,), 1, temperature=-1.0), VerifyRequest("", (), (1,), 1),
                VerifyRequest("a", (1,), (1,) * 511, 511)):
        with pytest.raises(InvalidRequest):
            verifier.check(bad)


def _scripted_verdicts(target, persistent, max_excess=0.25):
    """A fixed schedule of batches (rejections, new requests, subsets of a cohort, a client that
    leaves) through one verifier; returns every verdict and the verifier."""
    verifier = BatchVerifier(target, max_depth=6, persistent=persistent, max_excess=max_excess)
    rng = random.Random(7)
    state = {}  # client -> committed length
    out = []
    for step in range(40):
        clients = ["a", "b", "c", "d"] if step % 7 else ["b", "d"]  # a subset every 7th batch
        if step >= 30:
            clients = ["a", "c"]  # b and d left
        if step == 30:
            verifier.release("b")
            verifier.release("d")
        reqs = []
        for c in clients:
            drafts = tuple(rng.randrange(1, 40) for _ in range(rng.randint(0, 6)))
            if c not in state or rng.random() < 0.1:  # a new request: replaces the client's session
                prompt = tuple(rng.randrange(1, 40) for _ in range(rng.randint(1, 9)))
                reqs.append(VerifyRequest(c, drafts, prompt, len(prompt)))
            else:
                reqs.append(VerifyRequest(c, drafts, (), state[c]))
        rng.shuffle(reqs)  # arrival order varies
        for r, v in zip(reqs, verifier.verify(reqs), strict=True):
            state[r.client] = v.committed
            out.append((r.client, v))
    return out, verifier


def test_persistent_kv_gives_the_same_verdicts_as_stacking(models):
    target, close, _ = models
    stacked, _ = _scripted_verdicts(target, persistent=False)
    for max_excess in (0.0, 0.25, 10.0):  # re-stack at once, sometimes, never
        kept, verifier = _scripted_verdicts(target, persistent=True, max_excess=max_excess)
        assert kept == stacked, max_excess
        assert verifier.timing["reused"] > 0 and verifier.timing["stacked"] > 0
        for c in ("a", "c"):
            s = verifier.sessions[c]
            assert s.batch is not None and len(s.batch.row(s.row)[0][0][0, 0]) == s.committed - 1  # its KV covers committed - 1 tokens
        verifier.release("a")
        verifier.release("c")
        assert verifier._batches == {}  # nothing kept once every client is gone


def test_a_failed_forward_leaves_the_kept_kv_intact(models):
    target, close, _ = models
    verifier = BatchVerifier(target, max_depth=4, persistent=True)
    first = verifier.verify([VerifyRequest("a", (1, 2), (3, 4, 5), 3), VerifyRequest("b", (6,), (7, 8), 2)])
    nxt = [VerifyRequest("a", (9,), (), first[0].committed), VerifyRequest("b", (9, 9), (), first[1].committed)]
    reference = BatchVerifier(target, max_depth=4, persistent=False)
    reference.verify([VerifyRequest("a", (1, 2), (3, 4, 5), 3), VerifyRequest("b", (6,), (7, 8), 2)])
    forward = verifier.target.forward

    def broken(*args, **kwargs):
        kwargs["past_key_values"].layers[0].keys = kwargs["past_key_values"].layers[0].keys[:, :, :1]  # a half-done update
        raise RuntimeError("injected")

    verifier.target.forward = broken
    try:
        with pytest.raises(RuntimeError, match="injected"):
            verifier.verify(nxt)
    finally:
        verifier.target.forward = forward
    assert verifier.verify(nxt) == reference.verify(nxt)


def test_two_cohorts_alternate(models):
    target, close, _ = models
    jobs = [([[1 + i, 2, 3]], [24]) for i in range(4)]
    _, batcher = run_clients(target, close, jobs, cohorts=2, depth=2, window_s=0.05)
    assert max(batcher.stats.batch_sizes) <= 2  # a batch never mixes cohorts


# ------------------------------------------------------------------------------ depth controller


def simulated_pipeline(depth, alpha=0.8, t_draft=0.004, rtt=0.010, v0=0.030, v1=0.002):
    """Per-client tokens/s of two alternating cohorts: a client's period is its own verification
    plus the longer of (its drafting + network) and the other cohort's verification."""
    verify = v0 + v1 * depth
    edge = depth * t_draft + rtt
    tokens = (1 - alpha ** (depth + 1)) / (1 - alpha)
    return tokens / (verify + max(edge, verify)), verify, edge


@pytest.mark.parametrize("params", [dict(), dict(t_draft=0.002, rtt=0.005), dict(rtt=0.02, v0=0.045), dict(alpha=0.9, t_draft=0.006)])
@pytest.mark.parametrize("initial", [1, 8])
def test_depth_controller_settles_near_the_best_depth_of_a_sweep(params, initial):
    best = max(range(1, 9), key=lambda d: simulated_pipeline(d, **params)[0])
    rng = np.random.default_rng(0)
    ctl = DepthController(1, 8, initial=initial)
    depth = initial
    alpha = params.get("alpha", 0.8)
    for _ in range(20):
        _, verify, edge = simulated_pipeline(depth, **params)
        t_draft = params.get("t_draft", 0.004)
        jitter = lambda x: x * rng.uniform(0.9, 1.1)  # noqa: E731
        draws = rng.random(depth) < alpha  # each draft accepted with probability alpha, up to the first rejection
        accepted = depth if draws.all() else int(np.argmin(draws))
        depth = ctl.observe(jitter(t_draft), jitter(edge - depth * t_draft), jitter(verify), accepted, depth)
    assert abs(depth - best) <= 1, (depth, best)


def test_depth_controller_rejects_bad_settings():
    for kwargs in (dict(min_depth=0), dict(initial=9), dict(smoothing=0.0), dict(max_step=0)):
        with pytest.raises(ValueError):
            DepthController(**kwargs)


def test_profile_roles_write_the_server_and_edge_sections(pair, tmp_path):
    import yaml

    from envs.profile import Profile
    from runtime.profile import main as profile_main

    out = tmp_path / "p.yaml"
    grid = ["--pair", str(pair.path), "--b", "1", "--q", "1,3", "--c", "8,16", "--repeats", "1", "--threads", "1"]
    with pytest.raises(SystemExit, match="missing"):
        profile_main([*grid, "--role", "edge", "--out", str(out)])
    profile_main([*grid, "--role", "server", "--no-engine", "--out", str(out)])
    assert "edge" not in yaml.safe_load(out.read_text())
    profile_main([*grid, "--role", "edge", "--out", str(out)])
    prof = Profile.from_dict(yaml.safe_load(out.read_text()), name="p")
    assert prof.edge is not None and prof.edge.latency_source == "table" and float(prof.edge.tau_draft.tau(1, 1, 8)) > 0
    profile_main([*grid, "--role", "server", "--no-engine", "--out", str(out)])  # a server rewrite keeps the edge section
    assert Profile.from_dict(yaml.safe_load(out.read_text()), name="p").edge is not None


class RecordingDepth(DepthController):
    """A depth controller that keeps every per-token draft time it was given."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.seen = []

    def observe(self, draft_s_per_token, *args, **kw):
        self.seen.append(draft_s_per_token)
        return super().observe(draft_s_per_token, *args, **kw)


@pytest.mark.parametrize("proactive", [True, False])
def test_the_depth_controller_sees_every_drafted_token_but_the_prefill(models, proactive):
    """Proactive hits leave nothing to draft on demand; the per-token time still reaches the
    controller from the speculation (a stale estimate held clients at depth 1), and the first
    block's on-demand drafting (it carries the prompt's prefill) is never taken for it."""
    target, _, _ = models
    depth = RecordingDepth(min_depth=3, initial=3, max_depth=3)  # a fixed depth: a hit leaves the whole next block drafted
    batcher = VerificationBatcher(BatchVerifier(target), cohorts=1, window_s=0.0)
    link = DelayedLink(LocalLink(batcher), 40.0, 0.0, 1000.0)  # 40 ms round trips: time to draft the whole next block ahead
    edge = EdgeClient(target, link, depth=depth, proactive=proactive)  # the target as its own draft: every guess hits
    out = edge.generate([1, 2, 3, 4, 5, 6], 30)
    batcher.stop()
    hits = [i for i, log in enumerate(out.iterations) if log.proactive_hit]
    if proactive:
        # nothing left to draft on demand, but drafted ahead while the verdict travelled
        ahead = [i for i in hits if out.iterations[i].draft_ms == 0.0 and out.iterations[i].proactive_ms > 0]
        assert ahead and all(depth.seen[i] is not None and depth.seen[i] > 0 for i in ahead)
    else:
        assert not hits and depth.seen[0] is None
        assert all(depth.seen[i] is not None for i in range(1, len(out.iterations)) if out.iterations[i].depth > 0)


def test_the_batcher_reports_the_prompts_its_batch_prefilled(models):
    """``Reply.prompts`` counts the batch's rows that began a request (their prefill is in
    ``compute_ms``, so the depth controller leaves such a batch out of its verify fit); it
    survives the wire message."""
    from runtime.split.messages import msg_to_reply, reply_to_msg

    target, draft, _ = models
    [[first, second]], _ = run_clients(target, draft, [([[1, 2, 3], [4, 5]], [10, 10])], depth=2, proactive=False)
    for out in (first, second):
        prompts = [log.batch_prompts for log in out.iterations]
        assert prompts[0] == 1 and set(prompts[1:]) == {0}, prompts
    for prompts in (0, 3):
        reply = msg_to_reply(reply_to_msg(Reply(2, 7, 9, 1.5, 0.1, 4.0, 3, 1, prompts), seq=5))
        assert reply.prompts == prompts and reply == Reply(2, 7, 9, 1.5, 0.1, 4.0, 3, 1, prompts)
