"""Fast inference for the set policy: user encodings cached per round, numpy, one decision at a time.

Within a round the users still to come are always a *suffix* of the round's users in presentation
order (``envs.edge_schedule``: decision ``t`` sees users ``t + 1 .. K - 1``). The set policy's user
embeddings do not depend on the context (:mod:`agents.set_policy`), so :class:`CachedSetActor`
embeds the users of a round once -- at its first decision -- together with their attention keys and
values and suffix sums (mean) and suffix maxima, and then decides each user in O(n * embed_dim):
one query, ``n`` dot products per head, one weighted sum, and the small MLPs. numpy rather than
torch because at these sizes torch's per-call overhead (tens of microseconds per op) would cost
more than the arithmetic.

The cache is used only when it is provably the same round: the previous decision showed every
user still to come (fewer than ``max_users``) and this one shows exactly one user fewer; otherwise
(a new round, a look-ahead that is full, a jump) it is rebuilt from the observation at hand, which
is always exact. :meth:`CachedSetActor.reset` drops it explicitly (the scheduler calls it per
round). The actions equal :class:`agents.masked_policy.MaskedArgmax`'s on the same observations
(``tests/test_set_policy.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
from torch import nn

from agents.set_policy import (
    PRESENCE,
    PROGRESS,
    RANKED,
    SIZE_SCALE,
    SetFeaturesExtractor,
    round_size_feature,
)
from envs.edge_schedule import USER_FEATURES

if TYPE_CHECKING:
    from stable_baselines3.common.base_class import BaseAlgorithm

Layer = Callable[[np.ndarray], np.ndarray]


def _np(t) -> np.ndarray:
    return t.detach().cpu().numpy().astype(np.float32)


def _mlp(seq: nn.Module) -> list[Layer]:
    """An ``nn.Sequential`` of Linear / ReLU / Tanh as numpy functions."""
    layers: list[Layer] = []
    for mod in seq.modules() if isinstance(seq, nn.Sequential) else [seq]:
        if isinstance(mod, nn.Linear):
            w, b = _np(mod.weight).T.copy(), _np(mod.bias)
            layers.append(lambda x, w=w, b=b: x @ w + b)
        elif isinstance(mod, nn.ReLU):
            layers.append(lambda x: np.maximum(x, 0.0))
        elif isinstance(mod, nn.Tanh):
            layers.append(np.tanh)
        elif not isinstance(mod, nn.Sequential):
            raise TypeError(f"set_policy_fast: unsupported layer {type(mod).__name__} (Linear, ReLU, Tanh only)")
    return layers


def _run(layers: list[Layer], x: np.ndarray) -> np.ndarray:
    for f in layers:
        x = f(x)
    return x


def supports(model: BaseAlgorithm) -> bool:
    """True for an SB3 actor-critic policy whose actor uses :class:`SetFeaturesExtractor`."""
    policy = getattr(model, "policy", None)
    return hasattr(policy, "action_net") and isinstance(getattr(policy, "pi_features_extractor", None), SetFeaturesExtractor)


class CachedSetActor:
    """``act(obs, mask) -> action`` for one observation of EdgeSchedule-v0, users cached per round."""

    def __init__(self, model):
        if not supports(model):
            raise TypeError("CachedSetActor needs an actor-critic model with the set features extractor (agents.set_policy)")
        ex: SetFeaturesExtractor = model.policy.pi_features_extractor
        self.head, self.k_max, self.pool, self.heads = ex.head, ex.k_max, ex.pool, ex.heads
        self.context = _mlp(ex.context)
        self.user = _mlp(ex.user)
        if self.pool == "attention":
            self.query, self.key, self.value, self.out = (_mlp(m) for m in (ex.query, ex.key, ex.value, ex.out))
            self.null_key, self.null_value = _np(ex.null_key), _np(ex.null_value)
            d = self.null_key.shape[0]
            # the block-diagonal layout of the query: entry (i, i // dh) holds q[i]
            self._q_mask = (np.arange(d)[:, None] // (d // self.heads) == np.arange(self.heads)[None, :]).astype(np.float32)
            self._diag = np.arange(self.heads)
        self.actor = _mlp(model.policy.mlp_extractor.policy_net) + _mlp(model.policy.action_net)
        self.reset()

    def reset(self) -> None:
        """Forget the cached round (call before a new round; a new round is also detected)."""
        self._n_prev = -1
        self._rows = 0

    def _encode(self, users: np.ndarray) -> None:
        """Cache the embeddings of ``users`` (rows in presentation order) and their suffix statistics."""
        n, d = users.shape[0], None
        self._raw = users[:, :RANKED].copy()
        emb = _run(self.user, users)
        d = emb.shape[1]
        self._rows = n
        # suffix i = rows i..n-1; one extra zero row so that an empty suffix reads as 0
        self._suffix_sum = np.zeros((n + 1, d), dtype=np.float32)
        self._suffix_sum[:n] = np.cumsum(emb[::-1], axis=0)[::-1]
        if self.pool == "mean_max":
            self._suffix_max = np.zeros((n + 1, d), dtype=np.float32)
            self._suffix_max[:n] = np.maximum.accumulate(emb[::-1], axis=0)[::-1]
        else:
            self._keys = _run(self.key, emb)  # (n, d): head j is columns j*dh .. (j+1)*dh - 1
            self._values = _run(self.value, emb)

    def features(self, obs: np.ndarray) -> np.ndarray:
        """The extractor's features for one observation ``(obs_dim,)``, from the cache where it holds."""
        obs = np.asarray(obs, dtype=np.float32)
        users = obs[self.head :]
        n = self._n_prev - 1
        # users are packed from slot 0: one user fewer than last time is slot n - 1 present and slot n empty (O(1))
        if not (0 <= n < self._rows and (n == 0 or users[(n - 1) * USER_FEATURES + PRESENCE] > 0.5) and users[n * USER_FEATURES + PRESENCE] <= 0.5):
            n = int(np.count_nonzero(users[PRESENCE::USER_FEATURES] > 0.5))
        if not (0 < self._n_prev < self.k_max and n == self._n_prev - 1 and n <= self._rows):
            self._encode(users[: n * USER_FEATURES].reshape(n, USER_FEATURES))
        self._n_prev = n
        start = self._rows - n  # the users to come are the last n cached rows
        rank = (self._raw[start:] < obs[:RANKED]).sum(axis=0, dtype=np.float32) / max(n, 1)
        size_k = np.float32(round_size_feature(float(obs[PROGRESS]), float(n)))
        ctx = _run(self.context, np.concatenate([obs[: self.head], rank, [size_k]]))
        mean = self._suffix_sum[start] / max(n, 1)
        size = np.float32(math.log1p(n) / SIZE_SCALE)
        if self.pool == "mean_max":
            return np.concatenate([ctx, mean, self._suffix_max[start], [size]])
        h = self.heads
        d = ctx.shape[0]
        dh = d // h
        q = _run(self.query, ctx) / math.sqrt(dh)
        # one matmul for every head's scores: q laid out block-diagonally, (d, h)
        q_blocks = q[:, None] * self._q_mask
        scores = np.empty((n + 1, h), dtype=np.float32)
        scores[0] = self.null_key @ q_blocks
        scores[1:] = self._keys[start:] @ q_blocks
        scores -= scores.max(axis=0)
        w = np.exp(scores)
        w /= w.sum(axis=0)
        # (h, d) = every head's weights over every value column; keep each head's own columns
        read = (w[1:].T @ self._values[start:] + w[:1].T * self.null_value).reshape(h, h, dh)[self._diag, self._diag]
        return np.concatenate([ctx, _run(self.out, read.reshape(-1)), mean, [size]])

    def act(self, obs: np.ndarray, mask: np.ndarray) -> int:
        """The deterministic action among those ``mask`` allows (as ``MaskedArgmax``).

        A decision the mask forces (one action allowed -- most of a large round once the GPU is full)
        skips the network: ``MaskedArgmax`` would pick that action whatever the logits. The cache
        stays in step, as the skipped observation shows one user fewer than the last."""
        allowed = np.asarray(mask) > 0.5
        if np.count_nonzero(allowed) == 1:
            # a live cache (see features) steps one user on; any other state is dropped, so the next
            # decision re-encodes from its own observation (never a stale round)
            self._n_prev = self._n_prev - 1 if 0 < self._n_prev < self.k_max else -1
            return int(np.flatnonzero(allowed)[0])
        logits = _run(self.actor, self.features(obs))
        return int(np.argmax(np.where(allowed, logits, -1e8)))
