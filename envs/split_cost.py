"""Closed-form cost of SpecEdge's split mode (ED): the edge drafts, the server verifies.

Public contract (names stable; every time in seconds, every size in bytes, contexts in tokens):

* :class:`DraftTree` -- what an edge drafts per iteration: ``budget`` draft nodes (sent with the
  root, so the server verifies ``budget + 1`` query tokens per client), at most ``beams`` nodes
  expanded per level, ``branch`` children scored per expanded node, ``depth`` levels.
  ``DraftTree.chain(g)`` is a chain of depth ``g`` (budget g, one beam, one child).
* :func:`tree_shape` -> :class:`TreeShape`: expected tokens per iteration, the edge's pass widths,
  per-level acceptance and the proactive reuse path probability, for acceptance ``alpha``.
* :class:`SplitCostModel` (a profile with ``edge`` and ``network`` sections): the per-user
  iteration components (:meth:`~SplitCostModel.edge_draft_s`, :meth:`~SplitCostModel.network_s`,
  :meth:`~SplitCostModel.verify_s`, :meth:`~SplitCostModel.proactive`,
  :meth:`~SplitCostModel.edge_iteration_s`), memory (:meth:`~SplitCostModel.server_kv_bytes`,
  :meth:`~SplitCostModel.max_clients`), the steady state of N clients
  (:meth:`~SplitCostModel.steady_state` for SpecEdge, :meth:`~SplitCostModel.server_only` for
  server-only SD on the same server) and :meth:`~SplitCostModel.calibrated_depth`.

## Formulas and modelling choices

**Expected tokens per iteration.** Sample-and-match verification accepts the deepest drafted node
whose ancestors all match the target's samples, plus the target's bonus token. We use the
*positional acceptance* model (as Sequoia / SpecExec do): the ``r``-th best child of a node is the
target's sample with probability ``p_r = alpha (1 - alpha)^(r - 1)``, so a node's probability of
lying on the accepted path is the product of ``p_r`` along its path and
``E = 1 + sum over drafted nodes of that product``. The tree is the ``budget`` nodes of highest
path probability (SpecEdge's own top-``budget`` selection by cumulative score), within ``depth``
levels, ``branch`` children per node, children only under the ``beams`` best nodes of a level.
For a chain this is exactly ``E = (1 - alpha^(g+1)) / (1 - alpha)``.

**Edge drafting** (batch 1 on the edge device, the profile's ``edge.tau_draft``): one pass per
level of the kept tree (``D`` levels); pass 1 forwards the root, pass ``l + 1`` either SpecEdge's
beam (``pass_width="beams"``, default: ``w_{l+1} = min(beams, w_l * branch)`` candidates, what its
beam search forwards before the final trim to ``budget``) or only the kept tree's level ``l``
(``"kept"``: ``min(beams, n_l)``, a lower bound), at context ``c + nodes drafted so far``. A chain of depth ``g``
costs ``sum_{i<g} tau_E(1, 1, c + i)``. Edge prefill: ``tau_E(1, I, I)``.

**Network** (per iteration): ``rtt + (up + down) / bandwidth`` with
``up = overhead + (budget + 1) * bytes_per_draft_token`` and
``down = overhead + (budget + 1) * bytes_per_reply_token``. A user's own RTT replaces the profile's.

**Server verify** of ``b`` clients: one batched target pass ``tau_L(b, q, c + q)`` with
``q = budget + 1`` query tokens per client, padded to the largest ``q`` in the batch, priced at the
batch's mean context ``c`` (exact for the roofline, linear in the context).

**Proactive drafting.** While its request is away (``wait`` = network + queueing + verify), the
edge drafts the next block assuming every draft is accepted and its guessed bonus is right. The
block is reused with probability ``P_reuse = P(the accepted path is the top path to depth D) *
bonus_match`` (chain: ``alpha^g * bonus_match``); ``bonus_match`` defaults to ``alpha`` (the guess
is the draft's top-1 token), configurable. The passes completed within the wait (``h``) are saved
on reuse: expected edge time ``D - P_reuse * sum_{i<=h} pass_i``. Choice (``interrupt``): ``"step"``
(default) -- a pass in flight when the verdict arrives finishes first, delaying the next block by
its remainder on every iteration; ``"immediate"`` -- dropped at once.

**Edge iteration** (the part of a client's iteration off the server):
``X = edge draft - proactive saving + interrupt delay + network``.

**Pipeline-aware cohorts** (steady state, N clients, alternating by index into cohorts A, B of
sizes ``ceil(N/2)``, ``floor(N/2)``; the server batches a cohort once all of it has arrived):
period ``T = max(V_A + V_B, V_A + X_A, V_B + X_B)`` with ``V`` each cohort's verify pass and ``X``
its slowest client's edge iteration. Proactive reuse is random per client, so ``X`` of a cohort is
the maximum of independent two-point variables (``hit`` with the reuse probability, else ``miss``):
a block reused by some clients of a cohort saves nothing unless all of them reuse. The closed form
takes ``E[T]`` over those maxima (exact for independent cycles; carry-over between cycles ignored). Without pipelining (one cohort): ``T = V_N + X``. Every
client's iteration takes ``T``; server occupancy ``(V_A + V_B) / T``; server throughput
``sum_k E_k / T``; inter-token latency ``ITL = N T / sum_k E_k`` (SpecEdge's metric: all clients'
iteration time over all their tokens). Proactive waits solve ``wait = T - (edge time before
send)`` by fixed-point iteration from the lower bound ``network + own cohort's verify``.

**Server-only SD** (the baseline, zero network): the same draft passes batched on the server
(``tau_S(b, width, c)``) then the verify pass: ``T = sum_l tau_S(b, w_l, c_l) + tau_L(b, q, c + q)``.

**Memory.** ED server KV per client ``(c_max + budget + 1) kv_L`` (target only: no draft weights, no
draft KV on the server); server-only SD ``(c_max + budget + 1)(kv_L + kv_S)`` plus ``W_S`` once.

**Calibrated depth** (SpecEdge's rule ``T_verify ~ draft + network``): per user, the chain depth
``g`` in ``1..max_depth`` minimising ``|X(g) - V(g)|`` where ``V`` is the verify pass of the cohort
it overlaps (``verify_clients`` clients); ties go to the deeper draft.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from envs.profile import Profile

INTERRUPTS = ("step", "immediate")
PASS_WIDTHS = ("beams", "kept")


@dataclass(frozen=True)
class DraftTree:
    """Draft shape: ``budget`` nodes, ``beams`` expanded per level, ``branch`` children each, ``depth`` levels."""

    budget: int
    beams: int = 1
    branch: int = 1
    depth: int | None = None  #: None = budget (no depth limit beyond the budget)
    #: what each edge pass forwards: "beams" (SpecEdge's beam search: level l + 1 forwards
    #: min(beams, width_l * branch) candidates) or "kept" (only the kept tree's nodes, capped at beams)
    pass_width: str = "beams"

    def __post_init__(self) -> None:
        if self.pass_width not in PASS_WIDTHS:
            raise ValueError(f"draft tree field 'pass_width' must be one of {list(PASS_WIDTHS)}, got {self.pass_width!r}")
        for name in ("budget", "beams", "branch"):
            v = getattr(self, name)
            if not isinstance(v, int | np.integer) or isinstance(v, bool) or v < 1:
                raise ValueError(f"draft tree field '{name}' must be an integer >= 1, got {v!r}")
        if self.depth is not None and (not isinstance(self.depth, int | np.integer) or self.depth < 1):
            raise ValueError(f"draft tree field 'depth' must be null or an integer >= 1, got {self.depth!r}")

    @classmethod
    def chain(cls, depth: int) -> DraftTree:
        return cls(budget=int(depth), beams=1, branch=1, depth=int(depth))

    @property
    def max_depth(self) -> int:
        return self.budget if self.depth is None else min(self.depth, self.budget)

    @property
    def is_chain(self) -> bool:
        return self.beams == 1 and self.branch == 1

    @property
    def verify_tokens(self) -> int:
        """Query tokens per client in the verify pass: the drafts plus the root (previous bonus)."""
        return self.budget + 1


@dataclass(frozen=True)
class TreeShape:
    """A draft tree's expectation under acceptance ``alpha`` (see the module docstring)."""

    expected_tokens: float  #: accepted drafts + the bonus, per iteration
    pass_widths: tuple[int, ...]  #: tokens forwarded by each edge pass, in order
    level_nodes: tuple[int, ...]  #: drafted nodes per level 1..D
    level_accept: tuple[float, ...]  #: P(level d accepted | levels < d accepted)
    top_path_prob: float  #: P(the accepted path is the top-1 path to depth D): proactive reuse's first factor
    verify_tokens: int


def _expected_chain(alpha: float, g: int) -> float:
    return g + 1.0 if alpha > 1.0 - 1e-9 else (1.0 - alpha ** (g + 1.0)) / (1.0 - alpha)


@lru_cache(maxsize=1 << 16)
def _shape(alpha: float, tree: DraftTree) -> TreeShape:
    a = min(max(float(alpha), 0.0), 1.0)
    if tree.is_chain:
        g = tree.max_depth
        acc = tuple([a] * g)
        return TreeShape(_expected_chain(a, g), (1,) * g, (1,) * g, acc, a**g, tree.verify_tokens)
    p = [a * (1.0 - a) ** r for r in range(tree.branch)]  # positional acceptance of the r-th child
    heap = [(-p[0], 0, 1, 0, 1.0)]  # (-path prob, tie, level, rank index, parent's path prob)
    tie, chosen, per_level, mass = 1, 0, {}, {}
    while heap and chosen < tree.budget:
        neg, _, level, r, parent = heapq.heappop(heap)
        prob = -neg
        chosen += 1
        order = per_level.get(level, 0) + 1
        per_level[level] = order
        mass[level] = mass.get(level, 0.0) + prob
        if order <= tree.beams and level < tree.max_depth:  # expanded: its best child is a candidate
            heapq.heappush(heap, (-prob * p[0], tie, level + 1, 0, prob))
            tie += 1
        if r + 1 < tree.branch:  # the next sibling is a candidate
            heapq.heappush(heap, (-parent * p[r + 1], tie, level, r + 1, parent))
            tie += 1
    depth = max(per_level) if per_level else 0
    nodes = tuple(per_level[d] for d in range(1, depth + 1))
    if tree.pass_width == "kept":
        widths = (1,) + tuple(min(tree.beams, n) for n in nodes[:-1])
    else:
        w = [1]
        for _ in range(depth - 1):
            w.append(min(tree.beams, w[-1] * tree.branch))
        widths = tuple(w)
    s = [1.0] + [mass[d] for d in range(1, depth + 1)]
    acc = tuple(s[d] / s[d - 1] if s[d - 1] > 0 else 0.0 for d in range(1, depth + 1))
    return TreeShape(1.0 + sum(s[1:]), widths, nodes, acc, a**depth, tree.verify_tokens)


def tree_shape(alpha: float, tree: DraftTree) -> TreeShape:
    """The :class:`TreeShape` of ``tree`` at acceptance ``alpha`` (cached per ``(alpha, tree)``)."""
    return _shape(float(alpha), tree)


def expected_tokens(alpha, tree: DraftTree):
    """Expected tokens per iteration (accepted drafts + bonus); numpy over ``alpha``."""
    if tree.is_chain:
        a = np.asarray(alpha, dtype=float)
        g = float(tree.max_depth)
        near = a > 1.0 - 1e-9
        safe = np.where(near, 0.5, a)
        return np.where(near, g + 1.0, (1.0 - safe ** (g + 1.0)) / (1.0 - safe))
    return np.vectorize(lambda x: tree_shape(x, tree).expected_tokens, otypes=[float])(alpha)


@dataclass(frozen=True)
class SplitOptions:
    """Switches of the split model (see the module docstring)."""

    proactive: bool = True
    bonus_match: float | None = None  #: P(guessed bonus == target's bonus | all accepted); None = alpha
    interrupt: str = "step"
    pipeline: bool = True

    def __post_init__(self) -> None:
        if self.bonus_match is not None and not 0.0 <= self.bonus_match <= 1.0:
            raise ValueError(f"split option 'bonus_match' must be null or in [0, 1], got {self.bonus_match!r}")
        if self.interrupt not in INTERRUPTS:
            raise ValueError(f"split option 'interrupt' must be one of {list(INTERRUPTS)}, got {self.interrupt!r}")


@dataclass(frozen=True)
class Proactive:
    """Expected effect of proactive drafting on one iteration."""

    reuse_probability: float
    saved_s: float  #: expected edge seconds saved (reuse probability x passes done in the wait)
    delay_s: float  #: interrupt delay (a pass in flight finishing after the verdict)
    done_s: float = 0.0  #: seconds of the next block's passes finished within the wait (saved on reuse)


@dataclass(frozen=True)
class SteadyState:
    """N clients in steady state (module docstring: pipeline-aware cohorts)."""

    num_clients: int
    iteration_s: float  #: every client's iteration (period T)
    itl_s: float  #: N T / sum E_k
    throughput_tok_s: float  #: sum E_k / T, the server's tokens per second
    server_busy: float  #: fraction of T the server spends verifying (occupancy)
    tokens_per_iteration: float  #: mean E_k
    verify_s: tuple[float, ...]  #: each cohort's verify pass
    edge_s: tuple[float, ...]  #: each cohort's slowest edge iteration X (empty for server-only)
    memory_bytes: float  #: server memory for the clients' KV (+ draft weights for server-only SD)
    fits_memory: bool


class SplitCostModel:
    """The split-mode formulas on one profile (needs its ``edge`` and ``network`` sections)."""

    def __init__(self, profile: Profile, options: SplitOptions | None = None):
        if profile.edge is None or profile.network is None:
            raise ValueError(f"profile {profile.name!r} needs 'edge' and 'network' sections for the split mode (see conf/profile/split_*.yaml)")
        self.profile = profile
        self.options = SplitOptions() if options is None else options
        self.tau_l = profile.tau_llm
        self.tau_s = profile.tau_slm
        self.tau_e = profile.edge.tau_draft
        self.net = profile.network
        self.kv_l = profile.kv_llm_bytes
        self.kv_s = profile.kv_slm_bytes
        self.kv_budget_bytes = profile.device.memory_bytes - profile.device.reserve_bytes - profile.llm.weight_bytes

    # ------------------------------------------------------------------ per-user components
    def edge_pass_s(self, shape: TreeShape, context: float) -> list[float]:
        """Seconds of each edge draft pass (batch 1) at ``context`` tokens."""
        out, done = [], 0
        for w, n in zip(shape.pass_widths, shape.level_nodes, strict=True):
            out.append(self.tau_e.tau1(1, w, context + done + w))
            done += n
        return out

    def edge_draft_s(self, alpha: float, tree: DraftTree, context: float) -> float:
        """Edge drafting time of one iteration, without proactive reuse."""
        return float(sum(self.edge_pass_s(tree_shape(alpha, tree), context)))

    def edge_prefill_s(self, input_tokens: int) -> float:
        """The draft's prompt prefill on the edge."""
        return self.tau_e.tau1(1, input_tokens, input_tokens)

    def uplink_bytes(self, tree: DraftTree) -> float:
        return self.net.request_overhead_bytes + tree.verify_tokens * self.net.bytes_per_draft_token

    def downlink_bytes(self, tree: DraftTree) -> float:
        return self.net.request_overhead_bytes + tree.verify_tokens * self.net.bytes_per_reply_token

    def network_s(self, tree: DraftTree, rtt_s: float | None = None) -> float:
        """Round trip of one verification: RTT + both messages' bytes / bandwidth."""
        rtt = self.net.rtt_s if rtt_s is None else float(rtt_s)
        return rtt + (self.uplink_bytes(tree) + self.downlink_bytes(tree)) / self.net.bandwidth_bytes_per_s

    def verify_s(self, b: int, tree: DraftTree, context: float) -> float:
        """The server's batched verify pass over ``b`` clients at mean ``context`` (0 if ``b = 0``)."""
        if b <= 0:
            return 0.0
        q = tree.verify_tokens
        return self.tau_l.tau1(b, q, context + q)

    def reuse_probability(self, alpha: float, tree: DraftTree) -> float:
        beta = alpha if self.options.bonus_match is None else self.options.bonus_match
        return tree_shape(alpha, tree).top_path_prob * beta

    def proactive(self, alpha: float, tree: DraftTree, context: float, wait_s: float) -> Proactive:
        """Expected saving and delay of proactive drafting during a ``wait_s`` verification wait."""
        if not self.options.proactive:
            return Proactive(0.0, 0.0, 0.0)
        passes = self.edge_pass_s(tree_shape(alpha, tree), context)
        p = self.reuse_probability(alpha, tree)
        done_s, delay = 0.0, 0.0
        for t in passes:
            if done_s + t > wait_s:  # the pass in flight when the verdict arrives
                delay = (done_s + t - wait_s) if self.options.interrupt == "step" else 0.0
                break
            done_s += t
        return Proactive(p, p * done_s, delay, done_s)

    def edge_iteration_s(self, alpha: float, tree: DraftTree, context: float, rtt_s: float | None = None, wait_s: float | None = None,
                         reused: bool | None = None) -> float:
        """``X``: a client's iteration time off the server (draft - proactive saving + delay + network).

        ``wait_s`` is the time its request is away; None = the lower bound network + a one-client
        verify. ``reused``: None = the expectation (saving x reuse probability), True = the block was
        reused (the whole saving), False = it was not (no saving; the interrupt delay still counts).
        """
        net = self.network_s(tree, rtt_s)
        wait = net + self.verify_s(1, tree, context) if wait_s is None else wait_s
        pro = self.proactive(alpha, tree, context, wait)
        saved = pro.saved_s if reused is None else (pro.done_s if reused else 0.0)
        return self.edge_draft_s(alpha, tree, context) - saved + pro.delay_s + net

    # ------------------------------------------------------------------ memory
    def server_kv_bytes(self, context_max: float, tree: DraftTree) -> float:
        """Server KV of one ED client: the target's only, for its context and the verify tokens."""
        return (context_max + tree.verify_tokens) * self.kv_l

    def max_clients(self, context_max: float, tree: DraftTree) -> int:
        """How many ED clients' KV fit on the server next to the target's weights."""
        return max(0, int(self.kv_budget_bytes // self.server_kv_bytes(context_max, tree)))

    # ------------------------------------------------------------------ steady state of N clients
    def steady_state(self, num_clients: int, alpha, tree: DraftTree, context: float, rtt_s=None, context_max: float | None = None,
                     pipeline: bool | None = None, iterations: int = 50) -> SteadyState:
        """SpecEdge with ``num_clients`` edge clients (``alpha``, ``rtt_s``: scalars or one per client).

        ``context``: mean context of a client's sequence over its life; ``context_max``: its largest
        (for memory; default ``context``). ``pipeline`` overrides the options' switch.
        """
        n = _clients(num_clients)
        a = np.broadcast_to(np.asarray(alpha, dtype=float), (n,))
        rtt = np.broadcast_to(np.asarray(self.net.rtt_s if rtt_s is None else rtt_s, dtype=float), (n,))
        pipe = self.options.pipeline if pipeline is None else pipeline
        cohorts = [np.arange(0, n, 2), np.arange(1, n, 2)] if (pipe and n >= 2) else [np.arange(n)]
        v = [self.verify_s(len(c), tree, context) for c in cohorts]
        draft = np.array([self.edge_draft_s(x, tree, context) for x in a])
        net = np.array([self.network_s(tree, r) for r in rtt])
        e = expected_tokens(a, tree) * np.ones(n)
        # wait = E[T] - E[edge time before sending]; start from the lower bound net + own cohort's verify
        wait = np.concatenate([net[c] + v[i] for i, c in enumerate(cohorts)])[np.argsort(np.concatenate(cohorts))]
        period, edge = 0.0, ()
        for _ in range(iterations):
            pro = [self.proactive(x, tree, context, w) for x, w in zip(a, wait, strict=True)]
            p = np.array([q.reuse_probability for q in pro])
            done = np.array([q.done_s for q in pro])
            miss = draft + np.array([q.delay_s for q in pro]) + net
            dists = [_max_of_two_point(miss[c] - done[c], miss[c], p[c]) for c in cohorts]
            new = _expected_period(v, dists)
            edge = tuple(float(vals @ probs) for vals, probs in dists)
            wait_new = np.maximum(new - (miss - net - p * done), net)
            if abs(new - period) <= 1e-12 * max(new, 1.0) and np.allclose(wait_new, wait, rtol=1e-12, atol=0):
                period = new
                break
            period, wait = new, wait_new
        mem = n * self.server_kv_bytes(context if context_max is None else context_max, tree)
        return SteadyState(n, period, n * period / float(e.sum()), float(e.sum()) / period, sum(v) / period, float(e.mean()),
                           tuple(v), tuple(edge), mem, mem <= self.kv_budget_bytes)

    def server_only(self, num_clients: int, alpha, tree: DraftTree, context: float, context_max: float | None = None) -> SteadyState:
        """Server-only SD: the same draft passes and verify pass, batched on the server, no network."""
        n = _clients(num_clients)
        a = np.broadcast_to(np.asarray(alpha, dtype=float), (n,))
        # a batch drafts as wide as its widest shape (sequences of one batch step together)
        shapes = [tree_shape(x, tree) for x in a]
        shape = max(shapes, key=lambda s: (len(s.pass_widths), sum(s.pass_widths)))
        draft, done = 0.0, 0
        for w, nodes in zip(shape.pass_widths, shape.level_nodes, strict=True):
            draft += self.tau_s.tau1(n, w, context + done + w)
            done += nodes
        period = draft + self.verify_s(n, tree, context)
        e = np.array([s.expected_tokens for s in shapes])
        cmax = context if context_max is None else context_max
        mem = n * (cmax + tree.verify_tokens) * (self.kv_l + self.kv_s) + self.profile.slm.weight_bytes
        return SteadyState(n, period, n * period / float(e.sum()), float(e.sum()) / period, 1.0, float(e.mean()),
                           (period,), (), mem, mem <= self.kv_budget_bytes)

    # ------------------------------------------------------------------ depth calibration
    def calibrated_depth(self, alpha, context: float, rtt_s=None, verify_clients: int = 1, max_depth: int = 8, tree: DraftTree | None = None):
        """Per user, the draft depth whose edge iteration best matches the overlapped verify pass.

        ``alpha`` and ``rtt_s`` are scalars or arrays (one per user); returns an int or an int array.
        ``tree``: calibrate the depth of this tree (its budget, beams and branch kept); None = a chain.
        """
        if not isinstance(max_depth, int | np.integer) or max_depth < 1:
            raise ValueError(f"max_depth must be an integer >= 1, got {max_depth!r}")
        a = np.asarray(alpha, dtype=float)
        rtt = np.asarray(self.net.rtt_s if rtt_s is None else rtt_s, dtype=float)
        a, rtt = np.broadcast_arrays(a, rtt)
        out = np.empty(a.shape, dtype=np.int64)
        for idx in np.ndindex(a.shape):
            best, best_gap = 1, math.inf
            for g in range(1, max_depth + 1):
                shape = DraftTree.chain(g) if tree is None else DraftTree(tree.budget, tree.beams, tree.branch, g)
                v = self.verify_s(max(verify_clients, 1), shape, context)
                gap = abs(self.edge_iteration_s(float(a[idx]), shape, context, float(rtt[idx]), wait_s=None) - v)
                if gap <= best_gap:
                    best, best_gap = g, gap
            out[idx] = best
        return int(out) if out.ndim == 0 else out


def _max_of_two_point(hit: np.ndarray, miss: np.ndarray, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distribution ``(values, probabilities)`` of ``max_k X_k``, ``X_k = hit_k`` w.p. ``p_k`` else ``miss_k`` (independent)."""
    vals = np.unique(np.concatenate([hit, miss]))
    below = np.where(vals[:, None] >= miss[None, :], 1.0, np.where(vals[:, None] >= hit[None, :], p[None, :], 0.0))
    pmf = np.diff(np.concatenate([[0.0], np.prod(below, axis=1)]))
    keep = pmf > 0
    return vals[keep], pmf[keep]


def _expected_period(verify: list[float], dists: list[tuple[np.ndarray, np.ndarray]]) -> float:
    """``E[T]``: one cohort ``V + X``; two ``max(V_A + V_B, V_A + X_A, V_B + X_B)``, X the cohorts' edge maxima."""
    if len(verify) == 1:
        vals, probs = dists[0]
        return float((verify[0] + vals) @ probs)
    (xa, pa), (xb, pb) = dists
    va, vb = verify
    t = np.maximum(np.maximum(va + vb, va + xa[:, None]), vb + xb[None, :])
    return float(pa @ t @ pb)


def _clients(num_clients: int) -> int:
    if not isinstance(num_clients, int | np.integer) or isinstance(num_clients, bool) or num_clients < 1:
        raise ValueError(f"num_clients must be an integer >= 1, got {num_clients!r}")
    return int(num_clients)
