"""What the cost model knows of a device and of a model: peak rates and memory of the device
(:class:`DeviceSpec`), the config numbers of a Llama-style decoder and the FLOPs, bytes and memory
they imply (:class:`ModelSpec`). Seconds and bytes throughout.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from envs.profile_fields import ProfileError, positive_field, refuse_unknown, require_field


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator (or CPU) as the cost model sees it."""

    name: str
    memory_bytes: float  #: total device memory Q
    bandwidth_bytes_per_s: float  #: peak memory bandwidth
    flops_per_s: float  #: peak dense matmul throughput at the models' dtype
    reserve_bytes: float  #: activations, runtime context, fragmentation: taken off Q first

    @classmethod
    def from_dict(cls, d: dict, where: str = "device.") -> DeviceSpec:
        w = where
        refuse_unknown(d, ("name", "memory_bytes", "bandwidth_bytes_per_s", "flops_per_s", "reserve_bytes"), w)
        spec = cls(
            name=str(require_field(d, "name", w)),
            memory_bytes=positive_field(d, "memory_bytes", w),
            bandwidth_bytes_per_s=positive_field(d, "bandwidth_bytes_per_s", w),
            flops_per_s=positive_field(d, "flops_per_s", w),
            reserve_bytes=positive_field(d, "reserve_bytes", w, allow_zero=True),
        )
        if spec.reserve_bytes >= spec.memory_bytes:  # nothing left for weights or KV: every user would be refused
            raise ProfileError(f"profile field '{w}reserve_bytes' must be < memory_bytes ({spec.memory_bytes:g}), got {spec.reserve_bytes:g}")
        return spec


@dataclass(frozen=True)
class ModelSpec:
    """A Llama-style decoder (GQA, SwiGLU) described by its config numbers."""

    name: str
    params: float  #: parameter count
    layers: int
    hidden: int  #: d
    ffn_hidden: int  #: d_ff
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    dtype_bytes: int

    @classmethod
    def from_dict(cls, d: dict, where: str) -> ModelSpec:
        w = f"{where}."
        refuse_unknown(d, ("name", "params", "layers", "hidden", "ffn_hidden", "heads", "kv_heads", "head_dim", "vocab", "dtype_bytes"), w)
        spec = cls(
            name=str(require_field(d, "name", w)),
            params=positive_field(d, "params", w),
            layers=positive_field(d, "layers", w, integer=True),
            hidden=positive_field(d, "hidden", w, integer=True),
            ffn_hidden=positive_field(d, "ffn_hidden", w, integer=True),
            heads=positive_field(d, "heads", w, integer=True),
            kv_heads=positive_field(d, "kv_heads", w, integer=True),
            head_dim=positive_field(d, "head_dim", w, integer=True),
            vocab=positive_field(d, "vocab", w, integer=True),
            dtype_bytes=positive_field(d, "dtype_bytes", w, integer=True),
        )
        if spec.kv_heads > spec.heads:
            raise ProfileError(f"profile field '{w}kv_heads' must be <= heads ({spec.heads}), got {spec.kv_heads}")
        return spec

    @property
    def weight_bytes(self) -> float:
        return self.params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> float:
        """K and V for every layer: ``2 * layers * kv_heads * head_dim * dtype_bytes``."""
        return 2.0 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    def flops(self, b: ArrayLike, q: ArrayLike, c: ArrayLike) -> np.ndarray:
        """FLOPs of one pass (Transformer blocks + LM head on every new token)."""
        d, dkv = self.hidden, self.kv_heads * self.head_dim
        per_token = self.layers * (4.0 * d * d + 4.0 * d * dkv + 6.0 * d * self.ffn_hidden) + 2.0 * d * self.vocab
        attention = self.layers * 4.0 * d * np.asarray(c, dtype=float)
        return np.asarray(b, dtype=float) * np.asarray(q, dtype=float) * (per_token + attention)

    def bytes_moved(self, b: ArrayLike, q: ArrayLike, c: ArrayLike) -> np.ndarray:
        """Bytes one pass streams: all weights once, plus every sequence's KV read and written."""
        b = np.asarray(b, dtype=float)
        return self.weight_bytes + b * np.asarray(c, dtype=float) * self.kv_bytes_per_token
