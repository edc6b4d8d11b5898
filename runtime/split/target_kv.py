"""Server side: each client's target KV, stacked into one padded batch for a forward and split
back afterwards.

A client's KV is a tuple of per-layer ``(keys, values)``, each ``(1, kv_heads, length, head_dim)``,
for the committed text minus its last token (the pending token, which the next query carries).
A batch left-pads every client's past to the longest one (the padding columns are masked out and
never kept) and right-pads the queries; the forward appends the queries' KV after the padded past,
so row ``i``'s new KV is ``past columns [P - len_i, P)`` plus ``query columns [P, P + keep_i)``.

On CUDA the padded widths are rounded up to buckets (fewer distinct shapes). Why: on an H200 the
verifier's forwards, whose past length changes with every batch, took about 100 ms each, while
the same forward repeated at one shape took 6-8 ms; that new shapes are the cost is a suspicion
that bucketing should confirm on a GPU (not measured yet).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

LayerKV = tuple[torch.Tensor, torch.Tensor]  # keys, values: (1, kv_heads, length, head_dim)
ClientKV = tuple[LayerKV, ...]


def kv_length(kv: ClientKV | None) -> int:
    return 0 if not kv else int(kv[0][0].shape[2])


def bucketed(n: int, bucket: int) -> int:
    """``n`` rounded up to a multiple of ``bucket`` (shape bucketing: fewer distinct shapes)."""
    return -(-n // bucket) * bucket


def stack_past(pasts: list[ClientKV | None], bucket: int = 1) -> tuple[DynamicCache, int]:
    """A cache holding every row's past, left-padded to the longest (rounded up to a multiple of
    ``bucket``); returns ``(cache, width)``. Rows without a past (a first request) are all
    padding; with no past at all the cache is empty."""
    longest = max(kv_length(p) for p in pasts)
    cache = DynamicCache()
    if longest == 0:
        return cache, 0
    width = bucketed(longest, bucket)
    template = next(p for p in pasts if kv_length(p) == longest)
    layers = []
    for layer, (k0, v0) in enumerate(template):
        keys = k0.new_zeros((len(pasts), k0.shape[1], width, k0.shape[3]))  # (B, kv_heads, P, head_dim)
        values = v0.new_zeros((len(pasts), v0.shape[1], width, v0.shape[3]))
        for row, past in enumerate(pasts):
            n = kv_length(past)
            if n:
                keys[row, :, width - n :] = past[layer][0][0]
                values[row, :, width - n :] = past[layer][1][0]
        layers.append((keys, values))
    return DynamicCache(ddp_cache_data=layers), width


def split_rows(cache: DynamicCache, width: int, past_lengths: list[int], keep: list[int]) -> list[ClientKV]:
    """Each row's KV after a forward: its own past plus the first ``keep[i]`` query columns."""
    out = []
    layers = [(layer.keys, layer.values) for layer in cache.layers]  # each (B, kv_heads, P + N, head_dim)
    for row, (n_past, n_keep) in enumerate(zip(past_lengths, keep, strict=True)):
        lo, hi = width - n_past, width + n_keep
        out.append(tuple((k[row : row + 1, :, lo:hi].clone(), v[row : row + 1, :, lo:hi].clone()) for k, v in layers))
    return out


class BatchKV:
    """One verification batch's padded target KV, kept for the next batch of the same clients.

    Why: stacking every client's KV into a padded batch before each forward and splitting it back
    afterwards copied the whole cache twice per verification (~15 % of a verify at 8 rows on a CPU);
    a cohort's clients come back together, so their batch can keep its cache. ``valid`` marks the
    columns that hold a row's KV: left padding, and the query columns of rejected drafts and of
    shorter queries, are holes that stay masked (the rows' positions are explicit, so a hole costs
    attention width, never correctness). :meth:`excess` is how much wider than a fresh stack the
    cache has grown; the verifier re-stacks beyond a threshold.
    """

    def __init__(self, clients: tuple[str, ...], cache, valid: torch.Tensor):
        self.clients = clients
        self.cache = cache  #: a DynamicCache, every layer (B, kv_heads, W, head_dim)
        self.valid = valid  #: (B, W) long: 1 where the column holds that row's KV

    @property
    def width(self) -> int:
        return int(self.valid.shape[1])

    def lengths(self) -> list[int]:
        """Tokens of KV each row holds."""
        return self.valid.sum(1).tolist()

    def excess(self) -> int:
        """Columns beyond the longest row (what a fresh stack would not have)."""
        return self.width - max(self.lengths(), default=0)

    def row(self, b: int) -> ClientKV:
        """Row ``b``'s KV as a client KV of its own (a copy of its valid columns, in order)."""
        cols = self.valid[b].nonzero()[:, 0]
        return tuple((layer.keys[b : b + 1].index_select(2, cols), layer.values[b : b + 1].index_select(2, cols)) for layer in self.cache.layers)

    def snapshot(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The layers' tensors now (a forward replaces them: :meth:`restore` undoes a failed one)."""
        return [(layer.keys, layer.values) for layer in self.cache.layers]

    def restore(self, layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        for layer, (k, v) in zip(self.cache.layers, layers, strict=True):
            layer.keys, layer.values = k, v


def stacked_valid(lengths: list[int], width: int) -> torch.Tensor:
    """The ``valid`` mask of a fresh left-padded stack: row ``i``'s last ``lengths[i]`` columns."""
    cols = torch.arange(width)[None, :]
    return (cols >= width - torch.tensor(lengths, dtype=torch.long)[:, None]).long()  # (B, W)
