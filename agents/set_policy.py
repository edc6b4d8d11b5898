"""A permutation-aware policy over all users of a round: one network for any round size K.

EdgeSchedule-v0's observation (``envs.edge_schedule``) is a head -- the current user, the two
batches' state, the chosen draft depth, progress and the action mask -- followed by the users
still to come, ``max_users`` slots of 8 features, packed from the first slot and padded with zeros
(feature 7 is the presence flag). With ``env.max_users`` at least the largest K (e.g. 500) the
observation holds *every* remaining user, and nothing in this network depends on K or on the slot
a user sits in:

* the head goes through an MLP: the **context** ``c``;
* each present user goes through a shared MLP conditioned on ``c`` (DeepSets' phi; the user's
  features next to the batches' state -- whether it would still fit is what matters);
* the set is pooled over the present users only -- ``pool="attention"``: one cross-attention
  read-out whose query is ``c`` (multi-head, with an always-present learned null key so an empty
  set is well defined), plus the masked mean; ``pool="mean_max"``: masked mean and max;
* features = ``[c, pooled...]`` go to SB3's usual policy / value MLPs (``net_arch``).

The network is invariant to the order of the users to come and to the amount of padding, so a
policy trained on a curriculum of small rounds runs on rounds of any size up to ``max_users``
(``conf/experiment/general.yaml``). Masks are respected as usual: MaskablePPO masks the logits
(and :class:`agents.masked_policy.MaskedArgmax` does so in the ONNX graph).

Speed: during training and in torch inference the padded slots beyond the batch's largest set are
cut off before the user MLP, so a K = 20 round costs K = 20 work even when ``max_users`` is 500.
Under ONNX export (and tracing) the full padded width is kept -- the graph must not depend on the
data -- and the masks make the result identical.

    MaskablePPO("MlpPolicy", env, policy_kwargs=set_policy_kwargs({"extractor": "set"}, max_gamma=8))
    python -m agents.train experiment=general      # the curriculum over K
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import gymnasium as gym
import torch
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
from torch import nn

from envs.edge_schedule import BATCH_FEATURES, USER_FEATURES

PRESENCE = USER_FEATURES - 1  #: index of the presence flag among a user's features
POOLS = ("attention", "mean_max")


def head_size(max_gamma: int) -> int:
    """Entries before the users to come: current user, two batches, depth/share/progress, the mask."""
    return USER_FEATURES + 2 * BATCH_FEATURES + 3 + 2 + max_gamma


@dataclass
class SetPolicyConfig:
    """``agent.features`` of a training config; ``extractor: flat`` (or an empty dict) is SB3's plain MLP."""

    extractor: str = "flat"
    embed_dim: int = 64  #: width of the context and user embeddings
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
    """Context + pooled set of the users to come (see the module docstring). Output ``3 * embed_dim``."""

    def __init__(self, observation_space: gym.spaces.Box, max_gamma: int = 8, embed_dim: int = 64, pool: str = "attention", heads: int = 4):
        obs_dim = int(observation_space.shape[0])
        head = head_size(max_gamma)
        if obs_dim <= head or (obs_dim - head) % USER_FEATURES:
            raise ValueError(f"observation of {obs_dim} values is not EdgeSchedule-v0's with max_gamma={max_gamma} (head {head} + 8 per user)")
        if pool not in POOLS:
            raise ValueError(f"pool must be one of {list(POOLS)}, got {pool!r}")
        super().__init__(observation_space, features_dim=3 * embed_dim)
        self.head = head
        self.k_max = (obs_dim - head) // USER_FEATURES
        self.pool = pool
        self.context = nn.Sequential(nn.Linear(head, embed_dim), nn.ReLU(), nn.Linear(embed_dim, embed_dim), nn.ReLU())
        self.user_in = nn.Linear(USER_FEATURES, embed_dim)
        self.user_ctx = nn.Linear(embed_dim, embed_dim, bias=False)
        self.user_out = nn.Sequential(nn.ReLU(), nn.Linear(embed_dim, embed_dim), nn.ReLU())
        if pool == "attention":
            self.null_key = nn.Parameter(torch.zeros(1, 1, embed_dim))
            self.attention = nn.MultiheadAttention(embed_dim, heads, batch_first=True)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        batch = obs.shape[0]
        ctx = self.context(obs[:, : self.head])
        users = obs[:, self.head :].reshape(batch, self.k_max, USER_FEATURES)
        if not _exporting():
            # users are packed from slot 0: drop the padding every row has (data-dependent, so not under export)
            n = int((users[:, :, PRESENCE] > 0.5).sum(dim=1).max().item()) if batch else 0
            users = users[:, : max(n, 1)]
        present = users[:, :, PRESENCE] > 0.5
        emb = self.user_out(self.user_in(users) + self.user_ctx(ctx).unsqueeze(1))
        weight = present.unsqueeze(-1).to(emb.dtype)
        count = weight.sum(dim=1)
        mean = (emb * weight).sum(dim=1) / count.clamp(min=1.0)
        if self.pool == "mean_max":
            # embeddings are >= 0 (ReLU), so masking to 0 keeps the max over the present users (0 for none)
            return torch.cat([ctx, mean, (emb * weight).amax(dim=1)], dim=1)
        keys = torch.cat([self.null_key.expand(batch, 1, -1), emb], dim=1)
        padding = torch.cat([torch.zeros(batch, 1, dtype=torch.bool, device=obs.device), ~present], dim=1)
        read, _ = self.attention(ctx.unsqueeze(1), keys, keys, key_padding_mask=padding, need_weights=False)
        return torch.cat([ctx, read.squeeze(1), mean], dim=1)
