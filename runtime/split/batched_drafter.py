"""Edge side: one draft device that runs every waiting session's next draft step as one batched
forward (continuous batching; ``runtime.edge --shared-device batched``).

When one edge process stands in for many SpecEdge clients it has one device where the testbed has
one per client. Drafted one after another (:mod:`runtime.split.draft_device`) the clients' blocks
queue behind each other: 32 clients at ~1 ms a step wait up to 32 steps for their turn, and the
server sees the stagger as small, late batches. A batched step costs little more than a single
one for a draft this small (the forward is dominated by per-operation overhead, not arithmetic),
so here every session that wants a token joins the next step: the device runs one forward for all
of them, and a session waits for at most the step already running. That is closer to what many
devices drafting side by side would do, and it is how an edge box serving several users would draft.

The device is a thread of its own that batches continuously, as a serving engine does: a session's
:meth:`BatchedDraftSession.extend` (a block on demand, or proactive drafting until the verdict
arrives) joins the running batch as one row and stays in it, one token per step, until its chain is
long enough or its ``stop()`` is true; then its caller wakes. Rows join at the next step (up to
``max_batch`` rows, oldest first), and a row waits for at most the step already running (unless
speculation yields, below). A per-token hand-off between the
client's thread and the device's (a first version) halved the batch: most clients were still
waking up to ask for their next token when the step began. Rows with one new token (decode) run in
one forward, rows with several (a prompt) in a second.

Speculation can yield (``speculation_yields=True``; ``runtime.edge --proactive-priority yield``):
a step that has on-demand rows (a block a client is about to send) then carries only those, and
the proactive rows (:meth:`BatchedDraftSession.extend` with ``speculative=True``) stay in the batch
and step whenever no on-demand row waits, as with ``--shared-device on``
(:mod:`runtime.split.draft_device`). The idea: with two cohorts one cohort drafts its next blocks
on demand while the other drafts proactively, and a wider step delays the blocks the server waits
for. Measured, it changes nothing beyond the noise (``results/split_bench/ab_yield_vs_equal``:
paired, 2-32 clients, 1-2 cohorts, 2 repeats: ITL yield/equal 0.91-1.05 with proactive drafting
on, 0.91-1.09 with it off, where yielding cannot act): an extra row costs a fraction of a step on
this draft. So the default is ``False`` (every row in every step), as in the published runs.
While yielding, the admission cap ``max_batch`` counts the on-demand rows only (a device full of
speculative rows never keeps a block out) and a step carries at most ``max_batch`` rows, oldest
first; the steps a speculative row sits out are its session's ``held_seconds`` (and
``wait_seconds``), so a caller can keep them out of its draft time per token. A speculative row
without a ``stop`` may sit out for as long as on-demand rows keep coming: give it one.
Proactive drafting's ITL cost with two cohorts comes from elsewhere, in part the depth controller's start
(``experiments.split_bench``'s docstring).

The forward is the draft model's own modules (embedding, norms, projections, rotary embedding, MLP,
head) around an attention over a slot-indexed KV pool that this module manages: ``pool[layer]`` is
``(slots, capacity, kv_heads, head_dim)``, one slot per open session, grown by doubling. Only
Llama-architecture drafts are supported (:func:`check_supported`); for others use the model's own
forward per session (``--shared-device on``). Its logits match the model's forward to float32
rounding (tests/test_split_batched_drafter.py), so drafts match :class:`~runtime.split.drafter.DraftSession`'s
except at exact near-ties, which only touch acceptance: the server's rule keeps the output lossless.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent import futures
from concurrent.futures import Future
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from runtime.split.drafter import DraftChain

SUPPORTED_MODEL_TYPES = ("llama",)
#: ``runtime.edge --proactive-priority``: ``equal`` (every row in every step) or ``yield`` (``speculation_yields``)
PROACTIVE_PRIORITIES = ("equal", "yield")


def supports(draft: torch.nn.Module) -> bool:
    """Whether the batched forward can run ``draft``: a Llama-architecture causal LM (the module
    names and the residual layout this module's forward assumes)."""
    return getattr(draft.config, "model_type", None) in SUPPORTED_MODEL_TYPES


def check_supported(draft: torch.nn.Module) -> None:
    """Raise ``ValueError`` unless :func:`supports` ``draft``."""
    if not supports(draft):
        raise ValueError(f"a batched draft device needs a draft of model_type in {SUPPORTED_MODEL_TYPES}, got {getattr(draft.config, 'model_type', None)!r}; "
                         "use --shared-device on (each session drafts with the model's own forward)")


@dataclass
class _Row:
    """One session's request in the running batch: draft until its chain holds ``upto`` tokens."""

    session: BatchedDraftSession
    upto: int
    stop: Callable[[], bool] | None
    queued_at: float  #: perf_counter, s
    result: Future
    speculative: bool = False  #: proactive drafting: yields to on-demand rows when the device says so
    joined: bool = False

    def finished(self) -> bool:
        # a closed session's row ends at once (its caller was interrupted and gave the slot up)
        return self.session.closed or len(self.session.chain) >= self.upto or (self.stop is not None and self.stop())


class BatchedDrafter:
    """A draft device shared by many sessions: one batched forward per step (see the module
    docstring). Thread-safe; :meth:`close` stops it and fails whatever is still queued.

    Counters: ``steps`` (forwards), ``rows`` (session-steps they carried), so ``rows / steps`` is
    the mean batch; ``yielded`` (speculative row-steps held back for on-demand rows).

    Args:
        draft: the draft model (a Llama-architecture causal LM, :func:`supports`).
        max_batch: the most rows one step carries.
        initial_capacity: KV positions per slot at first (the pool doubles as needed).
        speculation_yields: a step with on-demand rows leaves the speculative rows out (module docstring).
    """

    def __init__(self, draft, max_batch: int = 64, initial_capacity: int = 256, speculation_yields: bool = False) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        check_supported(draft)
        self.model = draft
        self.device = next(draft.parameters()).device
        self.dtype = next(draft.parameters()).dtype
        self.layers = draft.model.layers
        self.head_dim = self.layers[0].self_attn.head_dim
        self.kv_heads = draft.config.num_key_value_heads
        self.max_batch = max_batch
        self.speculation_yields = bool(speculation_yields)
        self._capacity = max(1, initial_capacity)
        self._pool_k: list[torch.Tensor] = []  #: per layer (slots, capacity, kv_heads, head_dim)
        self._pool_v: list[torch.Tensor] = []
        self._slots = 0
        self._free_slots: list[int] = []
        self._next_slot = 0
        self._lock = threading.Condition()
        self._queue: deque[_Row] = deque()
        self._closed = False
        self.steps = 0
        self.rows = 0
        self.yielded = 0
        self._thread = threading.Thread(target=self._serve, name="batched-drafter", daemon=True)
        self._thread.start()

    @property
    def queued(self) -> int:
        """Requests waiting to join the running batch now."""
        return len(self._queue)

    # ------------------------------------------------------------------ sessions
    def session(self, prompt: list[int]) -> BatchedDraftSession:
        """A new user's draft chain on this device (holds a KV slot until :meth:`BatchedDraftSession.close`)."""
        if not prompt:
            raise ValueError("prompt needs at least one token")
        with self._lock:
            if self._closed:
                raise RuntimeError("the batched draft device is closed")
            slot = self._free_slots.pop() if self._free_slots else self._take_new_slot()
        return BatchedDraftSession(self, slot, prompt)

    def _take_new_slot(self) -> int:
        slot, self._next_slot = self._next_slot, self._next_slot + 1
        return slot

    def _release_slot(self, slot: int) -> None:
        with self._lock:
            self._free_slots.append(slot)

    def _submit(self, session: BatchedDraftSession, upto: int, stop: Callable[[], bool] | None, speculative: bool = False) -> Future:
        row = _Row(session, upto, stop, time.perf_counter(), Future(), speculative)
        with self._lock:
            if self._closed:
                raise RuntimeError("the batched draft device is closed")
            self._queue.append(row)
            self._lock.notify()
        return row.result

    def _wait(self, result: Future) -> None:
        """Wait for a row, failing if the device thread has died (a request never hangs on it)."""
        while True:
            try:
                result.result(timeout=1.0)
                return
            except futures.TimeoutError:
                if not self._thread.is_alive() and not result.done():
                    raise RuntimeError("the batched draft device stopped") from None

    def close(self) -> None:
        """Stop the device thread; rows still queued fail with ``RuntimeError``."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        self._thread.join(timeout=10.0)

    # ------------------------------------------------------------------ the device thread
    def _serve(self) -> None:
        running: list[_Row] = []
        while True:
            with self._lock:
                while not self._queue and not running and not self._closed:
                    self._lock.wait()
                if self._closed:
                    for row in running + list(self._queue):
                        row.result.set_exception(RuntimeError("the batched draft device is closed"))
                    self._queue.clear()
                    return
                while self._queue and self._admitted(running) < self.max_batch:
                    running.append(self._queue.popleft())
            started = time.perf_counter()
            batch = []
            for row in running:
                try:
                    done = row.finished()
                except Exception as exc:  # noqa: BLE001 - a failing stop() ends its own row only
                    row.result.set_exception(exc)
                    continue
                if done:
                    row.result.set_result(None)
                    continue
                if not row.joined:
                    row.joined = True
                    row.session.wait_seconds += started - row.queued_at
                batch.append(row)
            running = batch
            if not batch:
                continue
            step = self._stepping(batch)
            try:
                tokens = self._step(step)
            except Exception as exc:  # noqa: BLE001 - a failed step fails its rows' requests, not the device
                for row in batch:  # the held-back rows too: the device's state is unknown after a failed step
                    row.result.set_exception(exc)
                running = []
                continue
            self.steps += 1
            self.rows += len(step)
            self.yielded += len(batch) - len(step)
            for row, token in zip(step, tokens, strict=True):
                row.session.record_draft(token)
            if len(step) < len(batch):  # the rows that sat this step out waited for it
                held_s, stepped = time.perf_counter() - started, {id(row) for row in step}
                for row in batch:
                    if id(row) not in stepped:
                        row.session.held_seconds += held_s
                        row.session.wait_seconds += held_s

    def _admitted(self, running: list[_Row]) -> int:
        """How many of ``running`` count against ``max_batch``: all, or only the on-demand rows while
        speculation yields (held-back speculative rows must not keep a block out)."""
        return sum(not row.speculative for row in running) if self.speculation_yields else len(running)

    def _stepping(self, batch: list[_Row]) -> list[_Row]:
        """The rows the next step carries: all of ``batch``, or only its on-demand rows when
        speculation yields and there are any (the speculative ones stay in the running batch)."""
        if not self.speculation_yields:
            return batch  # admission kept it within max_batch
        on_demand = [row for row in batch if not row.speculative]
        return (on_demand or batch)[: self.max_batch]  # oldest first

    @torch.no_grad()
    def _step(self, batch: list[_Row]) -> list[int]:
        """The next draft token of every row: decode rows (one new token) in one forward, the rest
        (prompts) in another."""
        unseen = [row.session.unseen() for row in batch]
        self._ensure_room(max(row.session.slot for row in batch) + 1, max(row.session.fed + len(u) for row, u in zip(batch, unseen, strict=True)))
        out: dict[int, int] = {}
        decode = [i for i, u in enumerate(unseen) if len(u) == 1]
        prefill = [i for i, u in enumerate(unseen) if len(u) > 1]
        for group in (decode, prefill):
            if group:
                out.update(zip(group, self._forward([batch[i] for i in group], [unseen[i] for i in group]), strict=True))
        return [out[i] for i in range(len(batch))]

    def _ensure_room(self, slots: int, length: int) -> None:
        """Grow the pool (doubling) to at least ``slots`` slots of ``length`` positions."""
        new_slots, new_cap = self._slots, self._capacity
        while new_slots < slots:
            new_slots = max(8, 2 * new_slots)
        while new_cap < length:
            new_cap *= 2
        if (new_slots, new_cap) == (self._slots, self._capacity) and self._pool_k:
            return
        shape = (new_slots, new_cap, self.kv_heads, self.head_dim)
        grown: list[list[torch.Tensor]] = []
        for pools in (self._pool_k, self._pool_v):  # built aside: a failed allocation leaves the pool as it was
            layers = []
            for i in range(len(self.layers)):
                layer = torch.zeros(shape, dtype=self.dtype, device=self.device)
                if pools:
                    layer[: pools[i].shape[0], : pools[i].shape[1]] = pools[i]
                layers.append(layer)
            grown.append(layers)
        self._pool_k, self._pool_v = grown
        self._slots, self._capacity = new_slots, new_cap

    def _forward(self, rows: list[_Row], unseen: list[list[int]]) -> list[int]:
        """One batched forward over ``rows`` (each with its own slot, start position and new tokens ``unseen``)."""
        n = max(len(u) for u in unseen)
        lengths = torch.tensor([len(u) for u in unseen], device=self.device)  # (B,)
        ids = torch.tensor([u + [0] * (n - len(u)) for u in unseen], dtype=torch.long, device=self.device)  # (B, n), right-padded
        starts = torch.tensor([row.session.fed for row in rows], device=self.device)  # (B,)
        positions = starts[:, None] + torch.arange(n, device=self.device)[None, :]  # (B, n)
        valid = torch.arange(n, device=self.device)[None, :] < lengths[:, None]  # (B, n): real tokens, not padding
        slots = torch.tensor([row.session.slot for row in rows], device=self.device)  # (B,)
        span = int((starts + lengths).max())  # keys 0..span-1 cover every row
        # each query sees its own row's keys up to its own position (causal, per row); a padded
        # query sees some keys too (no all-masked softmax), and its output is dropped
        mask = torch.arange(span, device=self.device)[None, None, :] <= positions[:, :, None]  # (B, n, span)
        write_b, write_i = valid.nonzero(as_tuple=True)  # (N,) each: the real tokens
        write_slot, write_pos = slots[write_b], positions[write_b, write_i]

        hidden = self.model.model.embed_tokens(ids)  # (B, n, hidden)
        cos, sin = self.model.model.rotary_emb(hidden, positions)  # (B, n, head_dim) each
        for layer, pool_k, pool_v in zip(self.layers, self._pool_k, self._pool_v, strict=True):
            attn = layer.self_attn
            x = layer.input_layernorm(hidden)
            q = attn.q_proj(x).view(len(rows), n, -1, self.head_dim).transpose(1, 2)  # (B, heads, n, head_dim)
            k = attn.k_proj(x).view(len(rows), n, -1, self.head_dim).transpose(1, 2)  # (B, kv_heads, n, head_dim)
            v = attn.v_proj(x).view(len(rows), n, -1, self.head_dim).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            pool_k[write_slot, write_pos] = k.transpose(1, 2)[write_b, write_i]  # (N, kv_heads, head_dim)
            pool_v[write_slot, write_pos] = v.transpose(1, 2)[write_b, write_i]
            keys = pool_k[slots, :span].transpose(1, 2)  # (B, kv_heads, span, head_dim)
            values = pool_v[slots, :span].transpose(1, 2)
            o = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask[:, None], scale=attn.scaling, enable_gqa=True)  # (B, heads, n, head_dim)
            hidden = hidden + attn.o_proj(o.transpose(1, 2).reshape(len(rows), n, -1))
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        last = hidden[torch.arange(len(rows), device=self.device), lengths - 1]  # (B, hidden): each row's last real token
        logits = self.model.lm_head(self.model.model.norm(last))  # (B, vocab)
        return logits.argmax(-1).tolist()


class BatchedDraftSession(DraftChain):
    """A draft chain whose steps run on a :class:`BatchedDrafter` (its KV in the device's pool)."""

    def __init__(self, device: BatchedDrafter, slot: int, prompt: list[int]):
        super().__init__(prompt)
        self.drafter, self.slot = device, slot
        self._closed = False
        self._inflight: Future | None = None

    def extend(self, upto: int, stop: Callable[[], bool] | None = None, speculative: bool = False) -> None:
        """Join the device's running batch until the chain holds ``upto`` tokens or ``stop()`` is
        true (the device asks before each step); blocks until then. ``speculative``: proactive
        drafting, which yields to on-demand rows if the device says so (:class:`BatchedDrafter`)."""
        if self._closed:
            raise RuntimeError("this draft session is closed")
        if len(self.chain) >= upto or (stop is not None and stop()):
            return
        t0 = time.perf_counter()
        self._inflight = self.drafter._submit(self, upto, stop, speculative)
        try:
            self.drafter._wait(self._inflight)
        finally:
            self.draft_seconds += time.perf_counter() - t0

    def close(self) -> None:
        """Give the KV slot back (idempotent); call it when the request ends. A step still carrying
        this session (its caller was interrupted) finishes first, so it never writes into the
        slot's next owner."""
        if self._closed:
            return
        self._closed = True  # a row still running ends at the device's next step
        if self._inflight is not None:
            try:
                self.drafter._wait(self._inflight)
            except Exception:  # noqa: BLE001 - its caller saw (or will not see) the failure; the slot is free either way
                pass
        self.drafter._release_slot(self.slot)

    @property
    def closed(self) -> bool:
        return self._closed


__all__ = ["BatchedDraftSession", "BatchedDrafter", "PROACTIVE_PRIORITIES", "SUPPORTED_MODEL_TYPES", "check_supported", "supports"]
