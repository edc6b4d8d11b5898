"""A permutation-aware policy over all users of a round: one network for any round size K.

EdgeSchedule-v0's observation (``envs.edge_schedule``) is a head -- the current user, the two
batches' state, the chosen draft depth, progress and the action mask -- followed by the users
still to come, ``max_users`` slots of 8 features, packed from the first slot and padded with zeros
(feature 7 is the presence flag). With ``env.max_users`` at least the largest K (e.g. 500) the
observation holds *every* remaining user, and nothing in this network depends on K or on the slot
a user sits in:

* the head, with the current user's rank within the set on each user feature (the share of the
  users to come below it: O(n) comparisons, no learning) and the round size K (from the progress
  and the number of users to come), goes through an MLP: the **context** ``c``;
* each present user goes through a shared MLP that does **not** see the context (DeepSets' phi):
  a user's embedding is the same at every decision of a round, so it is computed once per round
  (:mod:`agents.set_policy_fast` caches it; the users to come are always a suffix of the round);
* the set is pooled over the present users only -- ``pool="attention"``: one multi-head
  cross-attention read-out whose *query* comes from ``c`` and whose keys / values are linear in
  the cached embeddings (an always-present learned null key / value makes an empty set well
  defined), plus the masked mean; ``pool="mean_max"``: masked mean and max;
* a set-size term ``log(1 + n) / log(1 + 1000)`` (``n`` users to come);
* features = ``[c, pooled..., size]`` go to SB3's usual policy / value MLPs (``net_arch``).

Per decision the cost is O(n * embed_dim) once the embeddings are cached (the query's dot products
and the weighted sum of the values); mean and max over a suffix are O(embed_dim) from suffix sums.

The network is invariant to the order of the users to come and to the amount of padding, so a
policy trained on a curriculum of small rounds runs on rounds of any size up to ``max_users``
(``conf/experiment/general.yaml``). Masks are respected as usual: MaskablePPO masks the logits
(and :class:`agents.masked_policy.MaskedArgmax` does so in the ONNX graph).

:meth:`SetFeaturesExtractor.forward_round` computes the features of every decision of a round at
once from the round's user table (what behaviour cloning in :mod:`agents.imitation` trains on); it
is the same arithmetic as :meth:`~SetFeaturesExtractor.forward` on the observations.

    MaskablePPO("MlpPolicy", env, policy_kwargs=set_policy_kwargs({"extractor": "set"}, max_gamma=8))
    python -m agents.imitation ...                 # behaviour cloning of BALANCE (experiment=general)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
from torch import nn

from envs.edge_schedule import BATCH_FEATURES, USER_FEATURES

PRESENCE = USER_FEATURES - 1  #: index of the presence flag among a user's features
POOLS = ("attention", "mean_max")
RANKED = USER_FEATURES - 1  #: user features the current user is ranked on within the set (all but presence)
SIZE_SCALE = math.log1p(1000.0)
PROGRESS = USER_FEATURES + 2 * BATCH_FEATURES + 2  #: index of the progress t / K in the observation  #: the set-size feature is log(1 + n) / SIZE_SCALE (independent of max_users)


def round_size_feature(progress: torch.Tensor | np.ndarray | float, remaining: torch.Tensor | np.ndarray | float) -> torch.Tensor | np.ndarray | float:
    """``log(1 + K) / SIZE_SCALE`` of the round size ``K = (n + 1) / (1 - t / K)`` recovered from the
    progress ``t / K`` and the ``n`` users to come (the observation has no K; torch or numpy)."""
    k = (remaining + 1.0) / (1.0 - progress).clip(min=1e-3) if hasattr(progress, "clip") else (remaining + 1.0) / max(1.0 - progress, 1e-3)
    return (k + 1.0).log() / SIZE_SCALE if hasattr(k, "log") else np.log1p(k) / SIZE_SCALE


def head_size(max_gamma: int) -> int:
    """Entries before the users to come: current user, two batches, depth/share/progress, the mask."""
    return USER_FEATURES + 2 * BATCH_FEATURES + 3 + 2 + max_gamma


@dataclass
class SetPolicyConfig:
    """``agent.features`` of a training config; ``extractor: flat`` (or an empty dict) is SB3's plain MLP."""

    extractor: str = "flat"
    embed_dim: int = 32  #: width of the context and user embeddings
    pool: str = "attention"
    heads: int = 4  #: attention heads (embed_dim must be a multiple)

    @classmethod
    def from_dict(cls, values: dict[str, Any] | None) -> SetPolicyConfig:
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(values or {}) - known)
        if unknown:
            raise ValueError(f"unknown agent.features key(s) {unknown}; known: {sorted(known)}")
        cfg = cls(**(values or {}))
        if cfg.extractor not in ("flat", "set"):
            raise ValueError(f"agent.features.extractor must be 'flat' or 'set', got {cfg.extractor!r}")
        if not isinstance(cfg.embed_dim, int) or isinstance(cfg.embed_dim, bool) or not 4 <= cfg.embed_dim <= 1024:
            raise ValueError(f"agent.features.embed_dim must be an integer in [4, 1024], got {cfg.embed_dim!r}")
        if cfg.pool not in POOLS:
            raise ValueError(f"agent.features.pool must be one of {list(POOLS)}, got {cfg.pool!r}")
        if not isinstance(cfg.heads, int) or isinstance(cfg.heads, bool) or cfg.heads < 1 or cfg.embed_dim % cfg.heads:
            raise ValueError(f"agent.features.heads must be a positive divisor of embed_dim={cfg.embed_dim}, got {cfg.heads!r}")
        return cfg


def set_policy_kwargs(features: dict[str, Any] | None, max_gamma: int) -> dict[str, Any]:
    """SB3 ``policy_kwargs`` entries for ``agent.features`` (empty for the flat MLP)."""
    cfg = SetPolicyConfig.from_dict(features)
    if cfg.extractor == "flat":
        return {}
    kwargs = {k: v for k, v in asdict(cfg).items() if k != "extractor"}
    return {"features_extractor_class": SetFeaturesExtractor, "features_extractor_kwargs": {"max_gamma": max_gamma, **kwargs}}


def _exporting() -> bool:
    return torch.jit.is_tracing() or torch.onnx.is_in_onnx_export()


class SetFeaturesExtractor(BaseFeaturesExtractor):
    """Context + pooled set of the users to come (see the module docstring). Output ``3 * embed_dim + 1``."""

    def __init__(self, observation_space: gym.spaces.Box, max_gamma: int = 8, embed_dim: int = 32, pool: str = "attention", heads: int = 4):
        obs_dim = int(observation_space.shape[0])
        head = head_size(max_gamma)
        if obs_dim <= head or (obs_dim - head) % USER_FEATURES:
            raise ValueError(f"observation of {obs_dim} values is not EdgeSchedule-v0's with max_gamma={max_gamma} (head {head} + 8 per user)")
        if pool not in POOLS:
            raise ValueError(f"pool must be one of {list(POOLS)}, got {pool!r}")
        if embed_dim % heads:
            raise ValueError(f"heads must divide embed_dim={embed_dim}, got {heads}")
        super().__init__(observation_space, features_dim=3 * embed_dim + 1)
        self.head = head
        self.k_max = (obs_dim - head) // USER_FEATURES
        self.pool = pool
        self.heads = heads
        self.head_dim = embed_dim // heads  # a Python int, so tracing for ONNX keeps the scale a constant
        self.context = nn.Sequential(nn.Linear(head + RANKED + 1, embed_dim), nn.ReLU(), nn.Linear(embed_dim, embed_dim), nn.ReLU())
        self.user = nn.Sequential(nn.Linear(USER_FEATURES, embed_dim), nn.ReLU(), nn.Linear(embed_dim, embed_dim), nn.ReLU())
        if pool == "attention":
            self.query = nn.Linear(embed_dim, embed_dim)
            self.key = nn.Linear(embed_dim, embed_dim)
            self.value = nn.Linear(embed_dim, embed_dim)
            self.out = nn.Linear(embed_dim, embed_dim)
            self.null_key = nn.Parameter(torch.zeros(embed_dim))
            self.null_value = nn.Parameter(torch.zeros(embed_dim))

    def context_of(self, head: torch.Tensor, users: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
        """The context from the observation head ``(B, head)`` and the users to come ``(B, N, 8)``: the
        head and the current user's rank in the set (share of the users to come below it, per feature)."""
        cur = head[:, :RANKED].unsqueeze(1)
        weight = present.to(head.dtype).unsqueeze(-1)
        count = weight.sum(dim=1)
        rank = ((users[:, :, :RANKED] < cur).to(head.dtype) * weight).sum(dim=1) / count.clamp(min=1.0)
        return self.context(torch.cat([head, rank, round_size_feature(head[:, PROGRESS : PROGRESS + 1], count)], dim=1))

    def pool_set(self, ctx: torch.Tensor, emb: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
        """Features from contexts ``(B, d)``, user embeddings ``(B, N, d)`` and presence ``(B, N)``."""
        weight = present.unsqueeze(-1).to(ctx.dtype)
        count = weight.sum(dim=1)
        mean = (emb * weight).sum(dim=1) / count.clamp(min=1.0)
        size = torch.log1p(count) / SIZE_SCALE
        if self.pool == "mean_max":
            # embeddings are >= 0 (ReLU), so masking to 0 keeps the max over the present users (0 for none)
            return torch.cat([ctx, mean, (emb * weight).amax(dim=1), size], dim=1)
        b, h, dh = ctx.shape[0], self.heads, self.head_dim
        d = h * dh
        q = self.query(ctx).reshape(b, h, dh)
        k = self.key(emb).reshape(emb.shape[0], emb.shape[1], h, dh)
        v = self.value(emb).reshape(emb.shape[0], emb.shape[1], h, dh)
        scores = torch.einsum("bhe,bnhe->bnh", q, k) / math.sqrt(dh)
        scores = scores.masked_fill(~present.unsqueeze(-1), float("-inf"))
        null = (q * self.null_key.reshape(h, dh)).sum(-1).unsqueeze(1) / math.sqrt(dh)  # (B, 1, h)
        attn = torch.softmax(torch.cat([null, scores], dim=1), dim=1)
        read = attn[:, :1].transpose(1, 2) * self.null_value.reshape(h, dh) + torch.einsum("bnh,bnhe->bhe", attn[:, 1:], v)
        return torch.cat([ctx, self.out(read.reshape(b, d)), mean, size], dim=1)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        batch = obs.shape[0]
        users = obs[:, self.head :].reshape(batch, self.k_max, USER_FEATURES)
        if not _exporting():
            # users are packed from slot 0: drop the padding every row has (data-dependent, so not under export)
            n = int((users[:, :, PRESENCE] > 0.5).sum(dim=1).max().item()) if batch else 0
            users = users[:, : max(n, 1)]
        present = users[:, :, PRESENCE] > 0.5
        return self.pool_set(self.context_of(obs[:, : self.head], users, present), self.user(users), present)

    def forward_round(self, heads: torch.Tensor, users: torch.Tensor) -> torch.Tensor:
        """Features of every decision of ``R`` rounds of ``K`` users, ``(R * T, features_dim)``.

        ``heads`` ``(R, T, head)``: decision ``t``'s observation head; ``users`` ``(R, K, 8)``: each
        round's users in presentation order. Decision ``t`` sees users ``t + 1 .. K - 1`` (the env's
        look-ahead when ``max_users >= K - 1``)."""
        r, t, k = heads.shape[0], heads.shape[1], users.shape[1]
        emb = self.user(users)  # once per round: phi does not see the context
        emb = emb.unsqueeze(1).expand(r, t, k, emb.shape[-1]).reshape(r * t, k, emb.shape[-1])
        present = (torch.arange(k).unsqueeze(0) > torch.arange(t).unsqueeze(1)).repeat(r, 1)
        raw = users.unsqueeze(1).expand(r, t, k, USER_FEATURES).reshape(r * t, k, USER_FEATURES)
        return self.pool_set(self.context_of(heads.reshape(r * t, -1), raw, present), emb, present)
