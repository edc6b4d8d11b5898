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

**Expected tokens per iteration and edge passes** of a chain or a draft tree: ``envs.draft_tree``
(positional acceptance; SpecEdge's top-``budget`` tree; beam-search pass widths).

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

**What a reuse buys** (``proactive_gain``, a choice between SpecEdge's two proactive types):
``"time"`` (default; SpecEdge's ``included`` type) -- the reused passes are not drafted again, so
a hit saves edge time as above and the tree keeps its depth; ``"tokens"`` (SpecEdge's default
``excluded`` type) -- the next cycle still drafts its full ``D`` levels, on top of the reused
``proactive_depth`` levels (SpecEdge: 3), so a hit saves no edge time (the interrupt delay still
counts) but verifies a deeper tree of the same budget (``D + h`` levels, ``h`` = the proactive
levels finished within the wait, at most ``proactive_depth``, each pass as wide as the tree's own).
A deeper tree is itself reused less often (``P_h``: its top path is longer), so iterations form a
two-state chain (plain: reuse with ``P_0``; deepened: with ``P_h``) whose deepened share is
``pi = P_0 / (1 + P_0 - P_h)``; expected tokens ``E(D) + pi * (E(D + h) - E(D))``
(:meth:`SplitCostModel.proactive_tokens`).
The discrete-event check (``envs.split_des``) models ``"time"`` only.

**Edge iteration** (the part of a client's iteration off the server):
``X = edge draft - proactive saving + interrupt delay + network``.

**Pipeline-aware cohorts** (the steady state of N clients): ``envs.split_cohorts`` -- clients
alternate into two cohorts that the server verifies in turn, the period ``E[T]`` over each cohort's
slowest edge iteration (random proactive reuse), ITL, throughput and occupancy, and the fixed point of
the period and the proactive waits.

**Server-only SD** (the baseline, zero network): the same draft passes batched on the server
(``tau_S(b, width, c)``) then the verify pass: ``T = sum_l tau_S(b, w_l, c_l) + tau_L(b, q, c + q)``.

**SpecEdge's engines** (three opt-in switches, off by default so the v1 environment is unchanged):
``server_only_widths``, ``dense_attention_len`` and ``kv_staging_len``, each read from SpecEdge's code
and documented with its formula in ``envs.split_engine``.

**Memory.** ED server KV per client ``(c_max + budget + 1) kv_L`` (target only: no draft weights, no
draft KV on the server); server-only SD ``(c_max + budget + 1)(kv_L + kv_S)`` plus ``W_S`` once.

**Calibrated depth** (SpecEdge's rule ``T_verify ~ draft + network``): per user, the depth ``g`` in
``1..max_depth`` of a chain (or of a given tree, its budget, beams and branch kept) minimising
``|X(g) - V(g)|``, ``X`` the expected edge iteration at the lower-bound wait and ``V`` the verify
pass of the cohort it overlaps (``verify_clients`` clients); ties go to the deeper draft.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from envs.draft_tree import PASS_WIDTHS, DraftTree, TreeShape, expected_tokens, tree_shape
from envs.latency import LatencyModel
from envs.profile import Profile
from envs.split_cohorts import (
    Proactive,
    SteadyState,
    check_num_clients,
    cohort_indices,
    solve_period,
)
from envs.split_engine import (
    SERVER_ONLY_WIDTHS,
    SPECEDGE_MAX_LEN,
    dense_attention_bytes,
    extra_rows_s,
    kv_staging_bytes,
    padded_levels,
)

INTERRUPTS = ("step", "immediate")
PROACTIVE_GAINS = ("time", "tokens")
__all__ = ["INTERRUPTS", "PASS_WIDTHS", "PROACTIVE_GAINS", "SERVER_ONLY_WIDTHS", "SPECEDGE_MAX_LEN", "DraftTree", "Proactive", "SplitCostModel", "SplitOptions", "SteadyState", "TreeShape",
           "expected_tokens", "tree_shape"]


@dataclass(frozen=True)
class SplitOptions:
    """Switches of the split model (see the module docstring)."""

    proactive: bool = True
    bonus_match: float | None = None  #: P(guessed bonus == target's bonus | all accepted); None = alpha
    interrupt: str = "step"
    pipeline: bool = True
    #: what a proactive reuse buys: "time" (SpecEdge's `included`: saved edge passes) or "tokens"
    #: (its default `excluded`: a deeper tree next cycle, no saved time); module docstring
    proactive_gain: str = "time"
    proactive_depth: int = 3  #: levels drafted proactively under the guessed bonus (SpecEdge: 3)
    #: server-only SD's draft pass widths: "tree" (the tree's own) or "padded" (SpecEdge's server-only engine: ``beams`` per row at
    #: every one of ``depth`` levels); module docstring, "SpecEdge's engines"
    server_only_widths: str = "tree"
    #: None = off; else the KV slots every pass attends over with the GQA expansion materialised (SpecEdge: 2048), priced for
    #: batch rows beyond the first; module docstring, "SpecEdge's engines"
    dense_attention_len: int | None = None
    #: None = off; else the KV slots per row SpecEdge's verify stages and compacts (SpecEdge: 2048), priced for batch rows beyond
    #: the first; module docstring, "SpecEdge's engines"
    kv_staging_len: int | None = None

    def __post_init__(self) -> None:
        for name in ("proactive", "pipeline"):  # a string such as "false" is truthy: refuse it rather than read it as on
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"split option {name!r} must be true or false, got {getattr(self, name)!r}")
        if self.kv_staging_len is not None and (not isinstance(self.kv_staging_len, int) or isinstance(self.kv_staging_len, bool)
                                                or self.kv_staging_len < 1):
            raise ValueError(f"split option 'kv_staging_len' must be null or an integer >= 1, got {self.kv_staging_len!r}")
        if self.server_only_widths not in SERVER_ONLY_WIDTHS:
            raise ValueError(f"split option 'server_only_widths' must be one of {list(SERVER_ONLY_WIDTHS)}, got {self.server_only_widths!r}")
        if self.dense_attention_len is not None and (not isinstance(self.dense_attention_len, int) or isinstance(self.dense_attention_len, bool)
                                                     or self.dense_attention_len < 1):
            raise ValueError(f"split option 'dense_attention_len' must be null or an integer >= 1, got {self.dense_attention_len!r}")
        if self.proactive_gain not in PROACTIVE_GAINS:
            raise ValueError(f"split option 'proactive_gain' must be one of {list(PROACTIVE_GAINS)}, got {self.proactive_gain!r}")
        if not isinstance(self.proactive_depth, int) or isinstance(self.proactive_depth, bool) or self.proactive_depth < 1:
            raise ValueError(f"split option 'proactive_depth' must be an integer >= 1, got {self.proactive_depth!r}")
        if self.bonus_match is not None and (isinstance(self.bonus_match, bool) or not isinstance(self.bonus_match, int | float)
                                             or not 0.0 <= self.bonus_match <= 1.0):
            raise ValueError(f"split option 'bonus_match' must be null or in [0, 1], got {self.bonus_match!r}")
        if self.interrupt not in INTERRUPTS:
            raise ValueError(f"split option 'interrupt' must be one of {list(INTERRUPTS)}, got {self.interrupt!r}")


class SplitCostModel:
    """The split-mode formulas on one profile (needs its ``edge`` and ``network`` sections)."""

    def __init__(self, profile: Profile, options: SplitOptions | None = None):
        if profile.edge is None or profile.network is None:
            raise ValueError(f"profile {profile.name!r} needs 'edge' and 'network' sections for the split mode (see envs/profiles/split_*.yaml)")
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
        t = self.tau_l.tau1(b, q, context + q)
        if self.options.dense_attention_len is None and self.options.kv_staging_len is None:  # off: v1's hot path unchanged
            return t
        return t + self.dense_attention_s(self.tau_l, b, context + q) + self.kv_staging_s(b, context, server_only=False)

    def server_only_verify_s(self, b: int, tree: DraftTree, context: float) -> float:
        """Server-only SD's verify pass: :meth:`verify_s` with its own KV bookkeeping instead of SpecEdge's staging."""
        if b <= 0:
            return 0.0
        q = tree.verify_tokens
        return self.tau_l.tau1(b, q, context + q) + self.dense_attention_s(self.tau_l, b, context + q) + self.kv_staging_s(b, context, server_only=True)

    def kv_staging_s(self, b: int, context: float, server_only: bool) -> float:
        """Seconds of per-verify KV bookkeeping for rows beyond the first (0 when off); ``envs.split_engine``."""
        span = self.options.kv_staging_len
        if span is None:
            return 0.0
        return extra_rows_s(self.tau_l, b, kv_staging_bytes(self.kv_l, self.kv_s, span, context, server_only), "kv_staging_len", self.profile.name)

    def dense_attention_s(self, latency: LatencyModel, b: int, context: float) -> float:
        """Seconds SpecEdge's dense attention adds to a pass of ``b`` rows at ``context`` on ``latency``'s roofline (0 when off or ``b <= 1``)."""
        span = self.options.dense_attention_len
        if span is None or b <= 1:
            return 0.0
        m = getattr(latency, "model", None)
        per_row = 0.0 if m is None else dense_attention_bytes(m, span, context)
        return extra_rows_s(latency, b, per_row, "dense_attention_len", self.profile.name)

    def reuse_probability(self, alpha: float, tree: DraftTree) -> float:
        beta = alpha if self.options.bonus_match is None else self.options.bonus_match
        return tree_shape(alpha, tree).top_path_prob * beta

    def proactive(self, alpha: float, tree: DraftTree, context: float, wait_s: float) -> Proactive:
        """Expected saving and delay of proactive drafting during a ``wait_s`` verification wait."""
        if not self.options.proactive:
            return Proactive(0.0, 0.0, 0.0)
        if self.options.proactive_gain == "tokens":  # the proactive subtree: proactive_depth levels of the same shape
            sub = self._deepened(tree, 0, levels_only=self.options.proactive_depth)
            passes = self.edge_pass_s(tree_shape(alpha, sub), context + tree.verify_tokens)
        else:
            passes = self.edge_pass_s(tree_shape(alpha, tree), context)
        p = self.reuse_probability(alpha, tree)
        done_s, delay, levels = 0.0, 0.0, 0
        for t in passes:
            if done_s + t > wait_s:  # the pass in flight when the verdict arrives
                delay = (done_s + t - wait_s) if self.options.interrupt == "step" else 0.0
                break
            done_s += t
            levels += 1
        if self.options.proactive_gain == "tokens":  # the next cycle drafts its full depth anyway: no time saved
            return Proactive(p, 0.0, delay, 0.0, levels)
        return Proactive(p, p * done_s, delay, done_s, levels)

    def proactive_tokens(self, alpha: float, tree: DraftTree, levels: int | None = None) -> float:
        """Expected extra tokens per iteration from proactive reuse (0 unless ``proactive_gain="tokens"``).

        A reuse verifies the tree deepened by the proactive levels drafted within the wait,
        ``h = min(proactive_depth, levels)`` (``levels``: passes finished in the wait,
        :attr:`Proactive.levels`; None = all ``proactive_depth``), at the same budget, beams and
        branch; the share of deepened iterations is the stationary ``pi = P_0 / (1 + P_0 - P_h)``
        of reuse from a plain (``P_0``) and from a deepened (``P_h``) tree.
        """
        if not self.options.proactive or self.options.proactive_gain != "tokens":
            return 0.0
        h = self.options.proactive_depth if levels is None else min(self.options.proactive_depth, int(levels))
        if h <= 0:
            return 0.0
        deep = self._deepened(tree, h)
        gain = tree_shape(alpha, deep).expected_tokens - tree_shape(alpha, tree).expected_tokens
        p0, ph = self.reuse_probability(alpha, tree), self.reuse_probability(alpha, deep)
        return p0 / (1.0 + p0 - ph) * gain

    @staticmethod
    def _deepened(tree: DraftTree, extra: int, levels_only: int | None = None) -> DraftTree:
        """``tree`` with ``extra`` more levels (or, with ``levels_only``, exactly that many), same budget, beams and branch.

        A tree keeps its budget (SpecEdge trims the deepened tree to it); a chain grows by its extra
        nodes, and its verify pass is still priced at ``g + 1`` query tokens (an approximation in the
        chain's favour: the deepened chain sends ``extra`` more).
        """
        depth = tree.max_depth + extra if levels_only is None else levels_only
        return DraftTree.chain(depth) if tree.is_chain else DraftTree(tree.budget, tree.beams, tree.branch, depth, pass_width=tree.pass_width)

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
    def steady_state(self, num_clients: int, alpha: ArrayLike, tree: DraftTree, context: float, rtt_s: ArrayLike | None = None, context_max: float | None = None,
                     pipeline: bool | None = None, iterations: int = 50) -> SteadyState:
        """SpecEdge with ``num_clients`` edge clients (``alpha``, ``rtt_s``: scalars or one per client).

        ``context``: mean context of a client's sequence over its life; ``context_max``: its largest
        (for memory; default ``context``). ``pipeline`` overrides the options' switch.
        """
        n = check_num_clients(num_clients)
        a = np.broadcast_to(np.asarray(alpha, dtype=float), (n,))
        rtt = np.broadcast_to(np.asarray(self.net.rtt_s if rtt_s is None else rtt_s, dtype=float), (n,))
        pipe = self.options.pipeline if pipeline is None else pipeline
        cohorts = cohort_indices(n, pipe)
        v = [self.verify_s(len(c), tree, context) for c in cohorts]
        draft = np.array([self.edge_draft_s(x, tree, context) for x in a])
        net = np.array([self.network_s(tree, r) for r in rtt])
        e = expected_tokens(a, tree) * np.ones(n)
        # the period and the waits it implies are solved together (envs.split_cohorts); each wait is priced by this model
        period, edge, wait = solve_period(v, cohorts, draft, net, lambda w: [self.proactive(x, tree, context, t) for x, t in zip(a, w, strict=True)],
                                          iterations)
        if self.options.proactive and self.options.proactive_gain == "tokens":  # the proactive levels drafted within the final waits
            pro = [self.proactive(x, tree, context, w) for x, w in zip(a, wait, strict=True)]
            e = e + np.array([self.proactive_tokens(float(x), tree, q.levels) for x, q in zip(a, pro, strict=True)])
        mem = n * self.server_kv_bytes(context if context_max is None else context_max, tree)
        return SteadyState(n, period, n * period / float(e.sum()), float(e.sum()) / period, sum(v) / period, float(e.mean()),
                           tuple(v), tuple(edge), mem, mem <= self.kv_budget_bytes)

    def server_only(self, num_clients: int, alpha: ArrayLike, tree: DraftTree, context: float, context_max: float | None = None) -> SteadyState:
        """Server-only SD: the same draft passes and verify pass, batched on the server, no network."""
        n = check_num_clients(num_clients)
        a = np.broadcast_to(np.asarray(alpha, dtype=float), (n,))
        # a batch drafts as wide as its widest shape (sequences of one batch step together)
        shapes = [tree_shape(x, tree) for x in a]
        shape = max(shapes, key=lambda s: (len(s.pass_widths), sum(s.pass_widths)))
        widths, nodes_per_level = shape.pass_widths, shape.level_nodes
        if self.options.server_only_widths == "padded":  # every level at full beam width (envs.split_engine)
            widths, nodes_per_level = padded_levels(shape, tree)
        draft, done = 0.0, 0
        for w, nodes in zip(widths, nodes_per_level, strict=True):
            draft += self.tau_s.tau1(n, w, context + done + w) + self.dense_attention_s(self.tau_s, n, context + done + w)
            done += nodes
        period = draft + self.server_only_verify_s(n, tree, context)
        e = np.array([s.expected_tokens for s in shapes])
        cmax = context if context_max is None else context_max
        mem = n * (cmax + tree.verify_tokens) * (self.kv_l + self.kv_s) + self.profile.slm.weight_bytes
        return SteadyState(n, period, n * period / float(e.sum()), float(e.sum()) / period, 1.0, float(e.mean()),
                           (period,), (), mem, mem <= self.kv_budget_bytes)

    # ------------------------------------------------------------------ depth calibration
    def calibrated_depth(self, alpha: ArrayLike, context: float, rtt_s: ArrayLike | None = None, verify_clients: int = 1, max_depth: int = 8,
                         tree: DraftTree | None = None) -> int | np.ndarray:
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
