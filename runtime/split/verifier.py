"""Server side: batched verification of many clients' draft chains in one target forward.

Each client has a session: its target KV (``target_kv``), its pending token (the last committed
token, whose KV the target has not computed yet), its committed length, and its own sampling
generator (so a client's output does not depend on who else shares the batch). A request carries
the client's drafts -- plus the prompt when it starts a new user request -- and the committed
length the edge believes in, as a cross-check. The query of row ``i`` is ``context + drafts``
where the context is the prompt (first request) or the pending token; the target's token at the
last context position and after every draft are the ``samples`` of :mod:`.acceptance`.

**Persistent KV** (``persistent``, the default with shape bucket 1, i.e. off CUDA): a batch's
padded cache stays with its clients (:class:`~runtime.split.target_kv.BatchKV`); when the same
clients come back together (a cohort) their next forward appends to it -- no per-batch gather of
every client's KV into a padded batch and no split back. Rows are ordered by client id so a cohort
always maps to the same rows; a different set of clients, or a cache grown ``max_excess`` wider
than a fresh stack would be (holes: rejected drafts, shorter queries, a row's finished request),
re-stacks from the rows' own KV. On CUDA (bucket 64) the stack-and-split path stays: a growing
cache is a new shape every batch, which is what bucketing avoids there.

State-dependent checks (no session, a stale committed length) fail only their own row; static
checks (:func:`check_request`) run when a message arrives, before it is queued.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from runtime.split.acceptance import emitted
from runtime.split.target_kv import (
    BatchKV,
    ClientKV,
    bucketed,
    kv_length,
    split_rows,
    stack_past,
    stacked_valid,
)


class InvalidRequest(ValueError):
    """A request that names a bad field; the transport maps it to INVALID_ARGUMENT."""


@dataclass(frozen=True)
class VerifyRequest:
    client: str
    drafts: tuple[int, ...]
    prompt: tuple[int, ...] = ()  #: non-empty: a new user request (replaces the client's session)
    committed: int = 0  #: the edge's committed length (prompt + emitted tokens) before this step
    temperature: float = 0.0
    seed: int = 0  #: the server's sampling seed for this user request (with ``prompt``)


@dataclass(frozen=True)
class Verdict:
    accepted: int  #: drafts accepted
    bonus: int  #: the server's token after them
    committed: int  #: committed length after this step


@dataclass
class Session:
    kv: ClientKV | None
    pending: int
    committed: int
    temperature: float
    generator: torch.Generator = field(repr=False)
    #: persistent KV: the batch whose cache holds this client's KV, and its row there (``kv`` is then None)
    batch: BatchKV | None = field(default=None, repr=False)
    row: int = -1

    def past(self) -> ClientKV | None:
        """This client's KV as a client KV of its own (a copy when it lives in a batch)."""
        return self.batch.row(self.row) if self.batch is not None else self.kv


def check_request(req: VerifyRequest, vocab_size: int, max_depth: int, max_positions: int) -> None:
    """Static validation: raises :class:`InvalidRequest` naming the field and its allowed range."""
    if not req.client:
        raise InvalidRequest("client must be a non-empty id")
    if not 0 <= len(req.drafts) <= max_depth:
        raise InvalidRequest(f"drafts: at most {max_depth} tokens per request, got {len(req.drafts)}")
    for name, ids in (("drafts", req.drafts), ("prompt", req.prompt)):
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise InvalidRequest(f"{name}: token ids must lie in [0, {vocab_size}), got {bad[0]}")
    if req.prompt and req.committed != len(req.prompt):
        raise InvalidRequest(f"committed must equal len(prompt) = {len(req.prompt)} on a new request, got {req.committed}")
    if not req.prompt and req.committed < 1:
        raise InvalidRequest(f"committed must be >= 1 on a continuing request, got {req.committed}")
    if req.committed + len(req.drafts) + 1 > max_positions:
        raise InvalidRequest(f"committed + drafts + 1 must be <= {max_positions} (the target's context), got {req.committed + len(req.drafts) + 1}")
    if not 0.0 <= req.temperature <= 100.0:
        raise InvalidRequest(f"temperature must lie in [0, 100], got {req.temperature}")


class BatchVerifier:
    """Holds every client's target state; verifies a batch of requests in one forward."""

    def __init__(self, target, max_depth: int = 16, bucket: int | None = None, cudnn_attention: bool = False,
                 persistent: bool | None = None, max_excess: float = 0.25):
        self.target = target
        self.device = next(target.parameters()).device
        #: on CUDA, attention may use cuDNN's kernel only when this is set. Why: on an H200 (torch
        #: 2.11) a verify at a first-seen shape took ~45 ms against 6-8 ms at a seen one
        #: (results/gpu_check/verify_timing.md) -- suspected to be cuDNN building an attention plan
        #: per shape; flash / memory-efficient / math kernels need no per-shape plan
        self.cudnn_attention = cudnn_attention
        #: padded past and query widths are rounded up to multiples of this (default: 64 on CUDA, 1 elsewhere)
        self.bucket = bucket if bucket is not None else (64 if self.device.type == "cuda" else 1)
        if self.bucket < 1:
            raise ValueError(f"bucket must be >= 1, got {self.bucket}")
        self.vocab_size = int(target.config.vocab_size)
        self.max_positions = int(getattr(target.config, "max_position_embeddings", 1 << 30))
        self.max_depth = max_depth
        self.sessions: dict[str, Session] = {}
        self.forward_seconds = 0.0  #: time in target forwards (the server's busy time)
        #: keep each batch's cache for its clients' next batch (default: with bucket 1, i.e. off CUDA)
        self.persistent = self.bucket == 1 if persistent is None else persistent
        if not max_excess >= 0:
            raise ValueError(f"max_excess must be >= 0 (a share of the longest row), got {max_excess}")
        self.max_excess = max_excess
        self._batches: dict[tuple[str, ...], BatchKV] = {}  #: persistent: the kept batch of each set of clients
        #: where verification time goes (seconds; pieces synchronised only at the end on CUDA) and how
        #: often a batch reused its clients' cache or re-stacked it
        self.timing = {"gather_s": 0.0, "forward_s": 0.0, "sample_s": 0.0, "store_s": 0.0, "reused": 0, "stacked": 0}

    def _attention_kernels(self):
        """The scaled-dot-product-attention kernels the forward may use (all of them off CUDA)."""
        if self.device.type != "cuda" or self.cudnn_attention:
            return contextlib.nullcontext()
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])

    def check(self, req: VerifyRequest) -> None:
        check_request(req, self.vocab_size, self.max_depth, self.max_positions)

    def release(self, client: str) -> bool:
        """Free a client's state (its request ended or its stream went away)."""
        found = self.sessions.pop(client, None) is not None
        for key in [k for k in self._batches if not any(c in self.sessions for c in k)]:
            del self._batches[key]  # nobody left to reuse it
        return found

    def _kept_source(self, key: tuple[str, ...], fresh: list[bool], sessions: list[Session], past_len: list[int]):
        """``_gather``'s answer from a kept batch, or None (then re-stack). The batch's clients must
        all come from one kept batch: the same clients (its cache as it is), or some of them (their
        rows selected: one copy per layer, then the columns no selected row uses dropped) -- with one
        cohort cut in two by the batching window, each half keeps its own cache after one selection.
        A row whose client just started a new request (its prompt prefilled into ``kv`` by
        :meth:`_prefill`, or a one-token prompt with no past) takes its old row's place."""
        olds = list({id(s.batch): s.batch for s in sessions if s.batch is not None}.values())
        source = olds[0] if len(olds) == 1 else (self._batches.get(key) if not olds else None)
        if source is None or not set(key) <= set(source.clients):
            return None
        if not all(s.batch is source or (s.batch is None and (fresh[b] or s.kv is not None)) for b, s in enumerate(sessions)):
            return None
        new = [b for b, s in enumerate(sessions) if s.batch is None]
        longest_new = max((past_len[b] for b in new), default=0)
        if key == source.clients:
            kept, before, valid, cache = source, source.snapshot(), source.valid.clone(), source.cache
        else:
            rows = torch.tensor([source.clients.index(c) for c in key])
            valid = source.valid.index_select(0, rows)
            valid[new] = 0  # dead rows use no column
            used = valid.any(0).nonzero()
            width = max(source.width - (int(used[0]) if len(used) else source.width), longest_new)
            lo = source.width - width
            if lo < 0:
                return None
            cache = DynamicCache(ddp_cache_data=[(layer.keys.index_select(0, rows)[:, :, lo:], layer.values.index_select(0, rows)[:, :, lo:])
                                                 for layer in source.cache.layers])
            valid = valid[:, lo:].clone()
            kept = BatchKV(key, cache, valid)
            before = kept.snapshot()
        w = kept.width
        if longest_new > w or w - max(past_len) > self.max_excess * max(*past_len, 32):
            return None
        for b in new:  # the row's old KV is dead: its new KV goes right-aligned into its row
            kv, n = sessions[b].kv, past_len[b]
            valid[b] = 0
            valid[b, w - n :] = 1
            if n:
                for layer, (k, v) in zip(cache.layers, kv, strict=True):
                    layer.keys[b, :, w - n :] = k[0]
                    layer.values[b, :, w - n :] = v[0]
        return cache, w, valid, kept, before

    def _gather(self, key: tuple[str, ...], fresh: list[bool], sessions: list[Session], past_len: list[int]):
        """The batch's past: ``(cache, width, valid (B, W), kept batch or None, its tensors before the forward)``."""
        if self.persistent:
            found = self._kept_source(key, fresh, sessions, past_len)
            if found is not None:
                self.timing["reused"] += 1
                return found
        pasts = [None if f else s.past() for f, s in zip(fresh, sessions, strict=True)]
        if [kv_length(p) for p in pasts] != past_len:
            raise RuntimeError(f"target KV lengths {[kv_length(p) for p in pasts]} do not match the sessions' {past_len}")
        cache, width = stack_past(pasts, self.bucket)
        self.timing["stacked"] += 1
        return cache, width, stacked_valid(past_len, width), None, None

    def _prefill(self, sessions: list[Session], contexts: list[list[int]], fresh: list[bool], past_len: list[int]) -> None:
        """New requests' prompts, all but the last token, in a forward of their own; each such row
        then joins the verification as a continuing one (context: the last prompt token). Why: in
        one padded forward every row's query is as wide as the longest, so a prompt of ~80 tokens
        made every other row of its batch compute ~80 query positions instead of its ~8."""
        rows = [b for b, f in enumerate(fresh) if f and len(contexts[b]) > 1]
        if not rows:
            return
        prompts = [contexts[b][:-1] for b in rows]
        width = max(len(p) for p in prompts)
        ids = torch.zeros((len(rows), width), dtype=torch.long)  # (R, L) right-padded: a real token never sees the padding after it
        for r, p in enumerate(prompts):
            ids[r, : len(p)] = torch.tensor(p, dtype=torch.long)
        cache = DynamicCache()
        with self._attention_kernels():
            self.target(input_ids=ids.to(self.device), position_ids=torch.arange(width, device=self.device)[None, :].expand(len(rows), -1),
                        past_key_values=cache, use_cache=True)
        for b, p, kv in zip(rows, prompts, split_rows(cache, 0, [0] * len(rows), [len(p) for p in prompts]), strict=True):
            sessions[b].kv, sessions[b].batch = kv, None
            contexts[b], fresh[b], past_len[b] = contexts[b][-1:], False, len(p)

    def _row_error(self, req: VerifyRequest) -> InvalidRequest | None:
        if req.prompt:
            return None
        s = self.sessions.get(req.client)
        if s is None:
            return InvalidRequest(f"client {req.client!r} has no open request: send its prompt first")
        if s.committed != req.committed:
            return InvalidRequest(f"committed: the server holds {s.committed} tokens for {req.client!r}, the request says {req.committed}")
        return None

    @torch.no_grad()
    def verify(self, requests: list[VerifyRequest]) -> list[Verdict | InvalidRequest]:
        """One verdict (or the row's error) per request, in order; one target forward for all."""
        if len({r.client for r in requests}) != len(requests):
            raise ValueError("one request per client per batch")
        results: list[Verdict | InvalidRequest] = [self._row_error(r) or None for r in requests]  # type: ignore[misc]
        rows = [i for i, r in enumerate(requests) if results[i] is None]
        if not rows:
            return results
        for i in rows:
            r = requests[i]
            if r.prompt:
                gen = torch.Generator(device=self.device).manual_seed(r.seed)
                self.sessions[r.client] = Session(None, -1, r.committed, r.temperature, gen)
        if self.persistent:
            rows.sort(key=lambda i: requests[i].client)  # a set of clients always gets the same rows
        sessions = [self.sessions[requests[i].client] for i in rows]
        fresh = [bool(requests[i].prompt) for i in rows]
        contexts = [list(requests[i].prompt) if requests[i].prompt else [s.pending] for i, s in zip(rows, sessions, strict=True)]
        # a continuing client's KV covers its committed text minus the pending token
        past_len = [0 if f else s.committed - 1 for f, s in zip(fresh, sessions, strict=True)]
        key = tuple(requests[i].client for i in rows)

        t0 = time.perf_counter()
        if self.persistent:
            self._prefill(sessions, contexts, fresh, past_len)
        queries = [c + list(requests[i].drafts) for i, c in zip(rows, contexts, strict=True)]
        cache, width, valid, kept, before = self._gather(key, fresh, sessions, past_len)
        n_q = bucketed(max(len(q) for q in queries), min(self.bucket, 8))
        ids = torch.zeros((len(rows), n_q), dtype=torch.long)  # (B, N) queries, right-padded with token 0
        for b, q in enumerate(queries):
            ids[b, : len(q)] = torch.tensor(q, dtype=torch.long)
        # (B, P + N): the past's valid columns, all query columns (padded query tokens come after the
        # real ones, which causally never see them)
        mask = torch.cat([valid, torch.ones((len(rows), n_q), dtype=torch.long)], dim=1)
        positions = torch.tensor(past_len)[:, None] + torch.arange(n_q)[None, :]  # (B, N) per-row positions
        t1 = time.perf_counter()
        try:
            with self._attention_kernels():
                logits = self.target(input_ids=ids.to(self.device), attention_mask=mask.to(self.device), position_ids=positions.to(self.device),
                                     past_key_values=cache, use_cache=True).logits  # (B, N, V)
        except BaseException:
            if kept is not None:
                kept.restore(before)  # the kept cache is the clients' only copy of their KV
            raise
        t2 = time.perf_counter()
        keep = []
        # greedy rows: one argmax and one device-to-host copy for the whole batch (a copy per row
        # is a synchronisation per row on CUDA)
        greedy = logits.argmax(-1).tolist() if any(s.temperature == 0 for s in sessions) else None  # (B, N) token ids
        for b, (i, s, ctx) in enumerate(zip(rows, sessions, contexts, strict=True)):
            drafts = list(requests[i].drafts)
            scores = logits[b, len(ctx) - 1 : len(ctx) + len(drafts)]  # (depth + 1, V)
            if s.temperature == 0:
                samples = greedy[b][len(ctx) - 1 : len(ctx) + len(drafts)]
            else:
                p = torch.softmax(scores.double() / s.temperature, dim=-1)
                samples = torch.multinomial(p, 1, generator=s.generator)[:, 0].tolist()
            n, bonus = emitted(drafts, samples)
            keep.append(len(ctx) + n)  # context + accepted drafts get target KV; the bonus is pending
            s.pending, s.committed = bonus, s.committed + n + 1
            results[i] = Verdict(n, bonus, s.committed)
        t3 = time.perf_counter()
        if self.persistent:
            new_cols = (torch.arange(n_q)[None, :] < torch.tensor(keep)[:, None]).long()  # (B, N) the queries' kept KV
            if kept is None:
                kept = BatchKV(key, cache, torch.cat([valid, new_cols], dim=1))
            else:
                kept.valid = torch.cat([valid, new_cols], dim=1)
            for other in [k for k in self._batches if k != key and not set(k).isdisjoint(key)]:
                del self._batches[other]  # its clients that are here have moved on (the rest keep a reference)
            self._batches[key] = kept
            for b, s in enumerate(sessions):
                s.batch, s.row, s.kv = kept, b, None
        else:
            for s, kv in zip(sessions, split_rows(cache, width, past_len, keep), strict=True):
                s.kv = kv
        t4 = time.perf_counter()
        for name, dt in (("gather_s", t1 - t0), ("forward_s", t2 - t1), ("sample_s", t3 - t2), ("store_s", t4 - t3)):
            self.timing[name] += dt
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self.forward_seconds += time.perf_counter() - t0
        return results
