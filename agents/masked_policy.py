"""A trained policy's deterministic, masked action as one torch module: ``(obs, mask) -> action``.

The same module runs in :class:`agents.policy.PolicyScheduler` (one forward pass, no SB3
``predict()`` overhead) and is what :mod:`agents.export` traces to ONNX, so the scheduler and the
exported runtime policy cannot drift apart. Masked-out actions get logit ``-1e8`` before the argmax
-- for a policy trained with masks (``use_mask``, MaskablePPO). A policy trained without them (PPO,
DQN) acts as trained: the mask input is accepted and ignored (an action it forbids is then refused
by the environment, a rejection), in the scheduler and in the ONNX graph alike.
"""

from __future__ import annotations

import torch
from torch import nn


class MaskedArgmax(nn.Module):
    """The deterministic policy with the mask applied: ``(obs, mask) -> argmax action``."""

    def __init__(self, model, use_mask: bool = True):
        super().__init__()
        self.policy = model.policy
        self.is_dqn = not hasattr(model.policy, "action_net")
        self.use_mask = use_mask

    def forward(self, obs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if self.is_dqn:
            logits = self.policy.q_net(obs)
        else:
            features = self.policy.extract_features(obs, self.policy.pi_features_extractor)
            latent = self.policy.mlp_extractor.forward_actor(features)
            logits = self.policy.action_net(latent)
        if not self.use_mask:  # still read from the mask input, so the traced graph keeps it (one signature for every policy)
            mask = torch.ones_like(mask)
        logits = torch.where(mask > 0.5, logits, torch.full_like(logits, -1e8))
        return torch.argmax(logits, dim=-1)
