"""A trained policy's deterministic, masked action as one torch module: ``(obs, mask) -> action``.

The same module runs in :class:`agents.policy.PolicyScheduler` (one forward pass, no SB3
``predict()`` overhead) and is what :mod:`agents.export` traces to ONNX, so the scheduler and the
exported runtime policy cannot drift apart. Masked-out actions get logit ``-1e8`` before the argmax.
"""

from __future__ import annotations

import torch
from torch import nn


class MaskedArgmax(nn.Module):
    """The deterministic policy with the mask applied: ``(obs, mask) -> argmax action``."""

    def __init__(self, model):
        super().__init__()
        self.policy = model.policy
        self.is_dqn = not hasattr(model.policy, "action_net")

    def forward(self, obs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if self.is_dqn:
            logits = self.policy.q_net(obs)
        else:
            features = self.policy.extract_features(obs, self.policy.pi_features_extractor)
            latent = self.policy.mlp_extractor.forward_actor(features)
            logits = self.policy.action_net(latent)
        logits = torch.where(mask > 0.5, logits, torch.full_like(logits, -1e8))
        return torch.argmax(logits, dim=-1)
