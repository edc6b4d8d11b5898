"""Server side: batched verification of many clients' draft chains in one target forward.

Each client has a session: its target KV (``target_kv``), its pending token (the last committed
token, whose KV the target has not computed yet), its committed length, and its own sampling
generator (so a client's output does not depend on who else shares the batch). A request carries
the client's drafts -- plus the prompt when it starts a new user request -- and the committed
length the edge believes in, as a cross-check. The query of row ``i`` is ``context + drafts``
where the context is the prompt (first request) or the pending token; the target's token at the
last context position and after every draft are the ``samples`` of :mod:`.acceptance`.

State-dependent checks (no session, a stale committed length) fail only their own row; static
checks (:func:`check_request`) run when a message arrives, before it is queued.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import torch

from runtime.split.acceptance import emitted
from runtime.split.target_kv import ClientKV, bucketed, kv_length, split_rows, stack_past


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

    def __init__(self, target, max_depth: int = 16, bucket: int | None = None, cudnn_attention: bool = False):
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
        return self.sessions.pop(client, None) is not None

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
        sessions = [self.sessions[requests[i].client] for i in rows]
        contexts = [list(requests[i].prompt) if requests[i].prompt else [s.pending] for i, s in zip(rows, sessions, strict=True)]
        queries = [c + list(requests[i].drafts) for i, c in zip(rows, contexts, strict=True)]
        pasts = [s.kv for s in sessions]
        past_len = [kv_length(p) for p in pasts]

        t0 = time.perf_counter()
        cache, width = stack_past(pasts, self.bucket)
        n_q = bucketed(max(len(q) for q in queries), min(self.bucket, 8))
        ids = torch.zeros((len(rows), n_q), dtype=torch.long)  # (B, N) queries, right-padded with token 0
        mask = torch.zeros((len(rows), width + n_q), dtype=torch.long)  # (B, P + N) left-padded past, all query columns
        for b, (q, n) in enumerate(zip(queries, past_len, strict=True)):
            ids[b, : len(q)] = torch.tensor(q, dtype=torch.long)
            mask[b, width - n :] = 1  # padded query tokens come after the real ones, which causally never see them
        positions = torch.tensor(past_len)[:, None] + torch.arange(n_q)[None, :]  # (B, N) per-row positions
        with self._attention_kernels():
            logits = self.target(input_ids=ids.to(self.device), attention_mask=mask.to(self.device), position_ids=positions.to(self.device),
                                 past_key_values=cache, use_cache=True).logits  # (B, N, V)
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
        for s, kv in zip(sessions, split_rows(cache, width, past_len, keep), strict=True):
            s.kv = kv
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self.forward_seconds += time.perf_counter() - t0
        return results
