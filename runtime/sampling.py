"""Per-row sampling for the batched engines: a temperature, a nucleus (top-p) and a seed per row.

A batch mixes **greedy rows** (temperature 0: the argmax, by exactly the operations the engines
used before rows had their own parameters, so their tokens are bit-identical) and **sampled rows**,
each with its own temperature, top-p and random stream.

A sampled row's distribution is ``top_p(softmax(logits / temperature))``: the smallest set of
most likely tokens whose probability reaches ``top_p`` (the most likely token always), renormalised.
Speculative decoding applies the same processing to the draft's and the target's distributions
and the draft samples from the processed one it reports, so the rejection rule yields exactly the
processed target distribution (reference: specdecode.md, "Exact rejection rule").

**Reproducibility.** Each sampled row draws its uniforms from its own ``torch.Generator`` (on the
CPU, so a seed gives the same stream on any device) and samples by inverse CDF, so its tokens
depend on its own seed, prompt, parameters and (SD) draft depth -- not on the rows beside it, up to
the floating-point differences of a different batch. AD and SD consume the stream differently, so
one seed gives the same tokens in the same mode and depth, not across modes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

SEED_MOD = 1 << 64  #: torch generators take seeds in [0, 2**64)


def _per_row(value, n: int, name: str) -> list:
    if isinstance(value, Sequence) and not isinstance(value, str):
        values = list(value)
        if len(values) != n:
            raise ValueError(f"{name} has {len(values)} values for {n} prompts")
        return values
    return [value] * n


def row_seeds(seed: int | Sequence[int], n: int) -> list[int]:
    """One seed per row: a list is taken as given; one integer is spread over the rows
    (row ``i`` gets a seed derived from ``(seed, i)``, independent streams)."""
    if isinstance(seed, Sequence):
        return [int(s) % SEED_MOD for s in _per_row(seed, n, "seed")]
    root = int(seed) % SEED_MOD
    return [int(np.random.SeedSequence([root, i]).generate_state(1, np.uint64)[0]) for i in range(n)]


def nucleus(p: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches ``top_p``, renormalised.

    ``p``: ``[..., vocab]`` probabilities; ``top_p``: ``[..., 1]`` in (0, 1] (1 keeps every token)."""
    sorted_p, order = p.sort(dim=-1, descending=True)
    before = sorted_p.cumsum(-1) - sorted_p  # mass of the more likely tokens
    keep_sorted = (before < top_p) | (top_p >= 1.0)
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    kept = torch.where(keep, p, torch.zeros_like(p))
    return kept / kept.sum(-1, keepdim=True)


def inverse_cdf(p: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One token per row of ``p`` (``[rows, vocab]``, rows summing to > 0) from uniforms ``u``
    (``[rows]`` in [0, 1)): the first token whose cumulative mass exceeds ``u`` x total, so a
    token of probability 0 is never drawn."""
    cdf = p.cumsum(-1)  # [rows, vocab]
    v = (u * cdf[:, -1])[:, None]  # [rows, 1]
    return torch.searchsorted(cdf, v, right=True)[:, 0].clamp(max=p.shape[-1] - 1)


class RowSampler:
    """Greedy and sampled rows of one batch (see the module docstring)."""

    def __init__(self, n: int, temperature: float | Sequence[float] = 0.0, top_p: float | Sequence[float] = 1.0,
                 seed: int | Sequence[int] = 0, device="cpu"):
        temps = [float(t) for t in _per_row(temperature, n, "temperature")]
        tops = [float(t) for t in _per_row(top_p, n, "top_p")]
        for i, (t, q) in enumerate(zip(temps, tops, strict=True)):
            if not (math.isfinite(t) and t >= 0):
                raise ValueError(f"temperature must be a finite number >= 0, got {t} (row {i})")
            if not (0 < q <= 1):
                raise ValueError(f"top_p must be in (0, 1], got {q} (row {i})")
        seeds = row_seeds(seed, n)
        sampled = [i for i, t in enumerate(temps) if t > 0]
        self.device = device
        self.greedy = not sampled  #: every row greedy: the engines take their plain argmax path
        self.rows = torch.tensor(sampled, dtype=torch.long, device=device)  #: [sampled] indices into the batch
        self.temperature = torch.tensor([temps[i] for i in sampled], dtype=torch.float64, device=device)  # [sampled]
        self.top_p = torch.tensor([tops[i] for i in sampled], dtype=torch.float64, device=device)  # [sampled]
        self.any_top_p = any(tops[i] < 1 for i in sampled)
        self.gens = [torch.Generator().manual_seed(seeds[i]) for i in sampled]

    def uniforms(self, k: int) -> torch.Tensor:
        """``[sampled, k]`` float64 uniforms in [0, 1), each row from its own stream."""
        u = torch.stack([torch.rand(k, generator=g, dtype=torch.float64) for g in self.gens])
        return u.to(self.device)

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """The sampled rows' processed distributions, float64 (for the acceptance ratios).

        ``logits``: ``[sampled, vocab]`` or ``[sampled, positions, vocab]`` (the sampled rows only)."""
        shape = (-1,) + (1,) * (logits.dim() - 1)
        p = torch.softmax(logits.double() / self.temperature.view(shape), dim=-1)
        return nucleus(p, self.top_p.view(shape)) if self.any_top_p else p

    def pick(self, logits: torch.Tensor) -> torch.Tensor:
        """One token per row of ``logits`` (``[batch, vocab]``): the argmax for greedy rows, a
        sample for the others."""
        tok = logits.argmax(dim=-1)  # [batch]
        if not self.greedy:
            tok[self.rows] = inverse_cdf(self.probs(logits[self.rows]), self.uniforms(1)[:, 0])
        return tok
