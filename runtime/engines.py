"""Batched autoregressive (AD) and speculative (SD) decoding with KV caches, on CPU or CUDA.

Both engines take a batch of prompts of different lengths (left padding, attention masks,
explicit position ids) and any Hugging Face causal LM.

**SD** (Leviathan et al.): per iteration the draft proposes ``gamma`` tokens autoregressively, the
target scores ``gamma + 1`` positions in one forward pass, each row keeps its accepted prefix plus
one target token (correction or bonus). Greedy (``temperature=0``): a draft token is accepted iff
it is the target's argmax, so the output is exactly greedy AD's. Sampling: the exact rejection rule
(accept ``x`` with probability ``min(1, p(x)/q(x))``, else resample from ``norm(max(0, p - q))``),
so the output is distributed exactly as the target's.

**Per-row sampling** (:mod:`runtime.sampling`): ``temperature``, ``top_p`` and ``seed`` are one
value for the batch or one per row. Greedy rows take the argmax path above unchanged (bit-identical
tokens whatever rows sit beside them); a sampled row's ``p`` and ``q`` are both its processed
distributions (its temperature, then its nucleus), so SD stays exact for each row's own setting.

**Rollback.** Rows accept different numbers of tokens, so rejected KV entries are first masked
out of attention per row (the position ids of the kept tokens stay contiguous), and the cache is
physically cropped wherever the tail is rejected in every row. The draft's cache lags the
committed text by one token, or two when every draft was accepted (the last draft token was
never fed to it); both cases are fed in one padded draft pass.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from runtime.sampling import RowSampler, inverse_cdf

# ------------------------------------------------------------------------------------- helpers


def left_pad(prompts: list[list[int]], pad_id: int, device: str | torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p) :] = 1
    return ids.to(device), mask.to(device)


def probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """The sampling distribution (float64 for the acceptance ratios)."""
    return torch.softmax(logits.double() / temperature, dim=-1)


def _limits(max_new_tokens: int | list[int], n: int) -> list[int]:
    lim = [max_new_tokens] * n if isinstance(max_new_tokens, int) else list(max_new_tokens)
    if len(lim) != n or any(m < 1 for m in lim):
        raise ValueError(f"max_new_tokens must be >= 1 for each of the {n} prompts")
    return lim


def _cache():
    from transformers import DynamicCache

    return DynamicCache()


def _forward(model, ids, mask, positions, cache):
    # without padding or rejected holes the plain causal mask is right, and much cheaper to build
    if bool(mask.all()):
        mask = None
    return model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True).logits


def prefill(model: torch.nn.Module, prompts: list[list[int]], pad_id: int = 0) -> torch.Tensor:
    """One prefill pass over ``prompts`` exactly as both engines run theirs -- left padding, attention
    mask, explicit position ids, a fresh cache -- for profilers that time it; returns the logits.
    (With rows of different lengths the mask is not all ones, so the pass cannot take the plain
    causal path: it costs more than an unpadded pass of the same shape.)"""
    device = next(model.parameters()).device
    ids, mask = left_pad(prompts, pad_id, device)
    with torch.no_grad():
        return _forward(model, ids, mask, (mask.cumsum(-1) - 1).clamp(min=0), _cache())


@dataclass
class GenerationResult:
    tokens: list[list[int]]  #: generated ids per prompt
    seconds: float
    target_passes: int = 0
    draft_passes: int = 0
    iterations: list[int] = field(default_factory=list)  #: SD iterations per prompt
    accepted: list[int] = field(default_factory=list)  #: accepted draft tokens per prompt
    rejections: list[int] = field(default_factory=list)  #: iterations that ended in a rejection

    @property
    def generated(self) -> int:
        return sum(len(t) for t in self.tokens)

    @property
    def tokens_per_s(self) -> float:
        return self.generated / max(self.seconds, 1e-12)

    @property
    def alpha_hat(self) -> float:
        """Per-token acceptance estimated from the runs (accepted / (accepted + rejections))."""
        a, r = sum(self.accepted), sum(self.rejections)
        return a / (a + r) if a + r else float("nan")

    @property
    def tokens_per_iteration(self) -> float:
        it = sum(self.iterations)
        return self.generated / it if it else float("nan")


@dataclass(frozen=True)
class RowEnd:
    """One prompt's row is finished: its own counters, the same ones its :class:`GenerationResult`
    reports (the one definition of measured acceptance: accepted / (accepted + rejections))."""

    row: int
    tokens: int  #: generated tokens
    eos: bool  #: ended at the end-of-sequence token (else at its token limit)
    iterations: int = 0  #: SD iterations (0 for AD)
    accepted: int = 0  #: accepted draft tokens
    rejections: int = 0  #: iterations that ended in a rejection


# ------------------------------------------------------------------------------------------ AD


def drain(steps: Generator[None, None, GenerationResult], after_step: Callable[[], None] | None = None) -> GenerationResult:
    """Run a step generator (:func:`ad_steps`, :func:`sd_steps`) to the end; return its result.
    ``after_step`` runs after every step."""
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            return stop.value
        if after_step is not None:
            after_step()


def generate_ad(model: torch.nn.Module, prompts: list[list[int]], max_new_tokens: int | list[int], **kwargs: Any) -> GenerationResult:
    """Batched autoregressive decoding with a KV cache (all of :func:`ad_steps` at once)."""
    return drain(ad_steps(model, prompts, max_new_tokens, **kwargs))


def generate_sd(target: torch.nn.Module, draft: torch.nn.Module, prompts: list[list[int]], gamma: int, max_new_tokens: int | list[int], **kwargs: Any) -> GenerationResult:
    """Batched speculative decoding (all of :func:`sd_steps` at once)."""
    return drain(sd_steps(target, draft, prompts, gamma, max_new_tokens, **kwargs))


@torch.no_grad()
def ad_steps(
    model: torch.nn.Module,
    prompts: list[list[int]],
    max_new_tokens: int | list[int],
    temperature: float | Sequence[float] = 0.0,
    eos_id: int | None = None,
    pad_id: int = 0,
    seed: int | Sequence[int] = 0,
    on_tokens: Callable[[int, list[int]], None] | None = None,
    on_finish: Callable[[RowEnd], None] | None = None,
    top_p: float | Sequence[float] = 1.0,
) -> Generator[None, None, GenerationResult]:
    """Batched AD as a generator: it yields after every forward pass (so a caller can share the
    device between batches) and returns the :class:`GenerationResult`; ``on_tokens(row, ids)``
    streams output and ``on_finish`` reports each row as soon as it is done. ``temperature``,
    ``top_p`` and ``seed``: one for the batch or one per row (:mod:`runtime.sampling`)."""
    device = next(model.parameters()).device
    limits = _limits(max_new_tokens, len(prompts))
    sampler = RowSampler(len(prompts), temperature, top_p, seed, device)
    start = time.perf_counter()
    ids, mask = left_pad(prompts, pad_id, device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = _cache()
    logits = _forward(model, ids, mask, positions, cache)[:, -1]
    passes = 1
    next_pos = mask.sum(-1)
    out: list[list[int]] = [[] for _ in prompts]
    done = [False] * len(prompts)
    while True:
        tok = sampler.pick(logits)
        for i, t in enumerate(tok.tolist()):
            if not done[i]:
                out[i].append(t)
                if on_tokens:
                    on_tokens(i, [t])
                done[i] = len(out[i]) >= limits[i] or (eos_id is not None and t == eos_id)
                if done[i] and on_finish:
                    on_finish(RowEnd(i, len(out[i]), eos_id is not None and t == eos_id))
        if all(done):
            break
        yield
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        logits = _forward(model, tok[:, None], mask, next_pos[:, None], cache)[:, -1]
        passes += 1
        next_pos = next_pos + 1
    return GenerationResult(out, time.perf_counter() - start, target_passes=passes)


# ------------------------------------------------------------------------------------------ SD


def _crop(cache, mask: torch.Tensor) -> torch.Tensor:
    """Physically drop trailing cache columns that every row has rejected."""
    valid_cols = mask.any(dim=0).nonzero()
    keep = int(valid_cols.max()) + 1 if len(valid_cols) else 0
    if keep < mask.shape[1]:
        cache.crop(keep - mask.shape[1])  # transformers 5: a negative count removes that many tokens
        return mask[:, :keep]
    return mask


@torch.no_grad()
def sd_steps(
    target: torch.nn.Module,
    draft: torch.nn.Module,
    prompts: list[list[int]],
    gamma: int,
    max_new_tokens: int | list[int],
    temperature: float | Sequence[float] = 0.0,
    eos_id: int | None = None,
    pad_id: int = 0,
    seed: int | Sequence[int] = 0,
    on_tokens: Callable[[int, list[int]], None] | None = None,
    on_finish: Callable[[RowEnd], None] | None = None,
    top_p: float | Sequence[float] = 1.0,
) -> Generator[None, None, GenerationResult]:
    """Batched speculative decoding (module docstring) as a generator that yields after every
    draft-verify iteration; lossless for greedy and for sampling. ``on_finish`` reports each row,
    with its acceptance counters, as soon as it is done. ``temperature``, ``top_p`` and ``seed``:
    one for the batch or one per row (:mod:`runtime.sampling`)."""
    if gamma < 1:
        raise ValueError(f"gamma must be >= 1, got {gamma}")
    device = next(target.parameters()).device
    limits = _limits(max_new_tokens, len(prompts))
    b = len(prompts)
    sampler = RowSampler(b, temperature, top_p, seed, device)
    srows = sampler.rows  # [sampled] the rows that sample; the others are greedy
    s_idx = torch.arange(len(srows), device=device)
    rows = torch.arange(b, device=device)
    start = time.perf_counter()
    ids, mask = left_pad(prompts, pad_id, device)
    tcache, dcache = _cache(), _cache()
    t_passes = d_passes = 0
    # both models pre-fill all but the last prompt token, which becomes the first pending token
    tmask, dmask = mask[:, :-1], mask[:, :-1].clone()
    if ids.shape[1] > 1:
        pos = (tmask.cumsum(-1) - 1).clamp(min=0)
        _forward(target, ids[:, :-1], tmask, pos, tcache)
        _forward(draft, ids[:, :-1], dmask, pos, dcache)
        t_passes += 1
        d_passes += 1
    pending = ids[:, -1]
    seq_len = mask.sum(-1)  # committed tokens, pending included
    extra = torch.full_like(pending, pad_id)  # the draft's second missing token (if any)
    has_extra = torch.zeros(b, dtype=torch.long, device=device)
    out: list[list[int]] = [[] for _ in prompts]
    done = [False] * b
    iterations, accepted, rejections = [0] * b, [0] * b, [0] * b
    offsets = torch.arange(gamma + 1, device=device)

    while not all(done):
        # 1. draft gamma tokens; its first pass also feeds the tokens it has not seen yet
        if bool(has_extra.any()):
            d_ids = torch.stack([extra, pending], dim=1)
            dmask = torch.cat([dmask, torch.stack([has_extra, torch.ones_like(has_extra)], dim=1)], dim=1)
            d_pos = torch.stack([(seq_len - 2).clamp(min=0), seq_len - 1], dim=1)
        else:  # the common case: only the last committed token is new to the draft
            d_ids, d_pos = pending[:, None], (seq_len - 1)[:, None]
            dmask = torch.cat([dmask, torch.ones((b, 1), dtype=dmask.dtype, device=device)], dim=1)
        logits = _forward(draft, d_ids, dmask, d_pos, dcache)[:, -1]
        d_passes += 1
        # a sampled row's uniforms for this iteration: gamma drafts, gamma acceptance tests, one target token
        u = None if sampler.greedy else sampler.uniforms(2 * gamma + 1)  # [sampled, 2 gamma + 1]
        drafts, q = [], []  # q: the sampled rows' draft distributions, gamma x [sampled, V]
        for g in range(1, gamma + 1):
            x = logits.argmax(dim=-1)  # [B]
            if not sampler.greedy:
                q.append(sampler.probs(logits[srows]))
                x[srows] = inverse_cdf(q[-1], u[:, g - 1])
            drafts.append(x)
            if g < gamma:
                dmask = torch.cat([dmask, torch.ones((b, 1), dtype=dmask.dtype, device=device)], dim=1)
                logits = _forward(draft, x[:, None], dmask, (seq_len - 1 + g)[:, None], dcache)[:, -1]
                d_passes += 1
        x = torch.stack(drafts, dim=1)  # (B, gamma)

        # 2. the target scores pending + gamma drafts in one pass
        tmask = torch.cat([tmask, torch.ones((b, gamma + 1), dtype=tmask.dtype, device=device)], dim=1)
        t_logits = _forward(target, torch.cat([pending[:, None], x], dim=1), tmask, seq_len[:, None] - 1 + offsets[None, :], tcache)
        t_passes += 1

        # 3. accept a prefix per row, then one target token (greedy rows: argmax agreement)
        t_arg = t_logits.argmax(dim=-1)  # (B, gamma + 1)
        ok = x == t_arg[:, :gamma]
        if not sampler.greedy:  # sampled rows: the exact rejection rule on the processed p and q
            p = sampler.probs(t_logits[srows])  # (sampled, gamma + 1, V)
            qs = torch.stack(q, dim=1)  # (sampled, gamma, V)
            xs = x[srows]
            px = p[:, :gamma].gather(-1, xs[..., None])[..., 0]
            qx = qs.gather(-1, xs[..., None])[..., 0]  # > 0: xs was drawn from qs
            ok[srows] = u[:, gamma : 2 * gamma] < px / qx  # strict: a token the target's nucleus cut is never accepted
        n = torch.cumprod(ok.long(), dim=1).sum(dim=1)  # accepted drafts per row
        y = t_arg[rows, n]
        if not sampler.greedy:
            ns = n[srows]
            p_n = p[s_idx, ns]  # (sampled, V)
            q_n = torch.cat([qs, torch.zeros_like(qs[:, :1])], dim=1)[s_idx, ns]  # no draft after gamma: bonus
            residual = torch.clamp(p_n - q_n, min=0)
            residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_n)
            y[srows] = inverse_cdf(residual, u[:, 2 * gamma])

        # 4. commit, stream, stop
        n_list, x_list, y_list = n.tolist(), x.tolist(), y.tolist()
        for i in range(b):
            if done[i]:
                continue
            iterations[i] += 1
            accepted[i] += n_list[i]
            rejections[i] += int(n_list[i] < gamma)
            new = x_list[i][: n_list[i]] + [y_list[i]]
            new = new[: limits[i] - len(out[i])]
            if eos_id is not None and eos_id in new:
                new = new[: new.index(eos_id) + 1]
            out[i].extend(new)
            if on_tokens and new:
                on_tokens(i, new)
            eos = eos_id is not None and bool(new) and new[-1] == eos_id
            done[i] = len(out[i]) >= limits[i] or eos
            if done[i] and on_finish:
                on_finish(RowEnd(i, len(out[i]), eos, iterations[i], accepted[i], rejections[i]))

        # 5. roll back rejected entries: mask per row, crop the common rejected tail
        tmask[:, -(gamma + 1) :] = (offsets[None, :] <= n[:, None]).to(tmask.dtype)
        if gamma > 1:
            dmask[:, -(gamma - 1) :] = (offsets[None, 1:gamma] <= n[:, None]).to(dmask.dtype)
        tmask = _crop(tcache, tmask)
        dmask = _crop(dcache, dmask)
        has_extra = (n == gamma).long()
        extra = torch.where(n == gamma, x[:, -1], torch.full_like(pending, pad_id))
        pending = y
        seq_len = seq_len + n + 1
        yield
    return GenerationResult(out, time.perf_counter() - start, t_passes, d_passes, iterations, accepted, rejections)
