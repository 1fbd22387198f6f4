"""Rotary position embedding (the rotate-half layout), with llama3 and YaRN frequency scaling."""

from __future__ import annotations

import math
from typing import Any, Dict, Optional, Tuple

import torch

from .base import BaseOP
from .norm import RMSNorm


def _inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))


def _llama3_scale(inv_freq: torch.Tensor, s: Dict[str, Any]) -> torch.Tensor:
    factor, low, high = s["factor"], s.get("low_freq_factor", 1.0), s.get("high_freq_factor", 4.0)
    old_ctx = s["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_ctx / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _yarn_scale(inv_freq: torch.Tensor, head_dim: int, theta: float, s: Dict[str, Any],
                max_pos: int) -> Tuple[torch.Tensor, float]:
    """Blend interpolated and extrapolated frequencies; return them and the attention factor
    (YaRN scales cos/sin by `0.1 ln(factor) + 1` so logits keep their temperature)."""
    factor = s["factor"]
    # transformers falls back to the model's own context when the original one is not given
    old_ctx = s.get("original_max_position_embeddings") or max_pos
    beta_fast, beta_slow = s.get("beta_fast", 32), s.get("beta_slow", 1)

    def dim_for(rotations: float) -> float:
        return head_dim * math.log(old_ctx / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low = max(math.floor(dim_for(beta_fast)), 0)
    high = min(math.ceil(dim_for(beta_slow)), head_dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolate = 1 - ramp
    freq = (inv_freq / factor) * (1 - extrapolate) + inv_freq * extrapolate
    attn_factor = s.get("attention_factor") or (0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0)
    return freq, attn_factor


class RotaryEmbedding(BaseOP):
    def __init__(self, head_dim: int, max_position: int, theta: float, scaling: Optional[Dict[str, Any]],
                 device: torch.device):
        inv_freq = _inv_freq(head_dim, theta)
        attn_factor = 1.0
        kind = (scaling or {}).get("rope_type") or (scaling or {}).get("type") or "default"
        if kind == "llama3":
            inv_freq = _llama3_scale(inv_freq, scaling)
        elif kind == "yarn":
            inv_freq, attn_factor = _yarn_scale(inv_freq, head_dim, theta, scaling, max_position)
        elif kind not in ("default", "linear"):
            raise ValueError(f"rope scaling type {kind!r} is not supported (default, linear, llama3, yarn are)")
        if kind == "linear":
            inv_freq = inv_freq / scaling["factor"]
        pos = torch.arange(max_position, dtype=torch.float32)
        freqs = pos[:, None] * inv_freq[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        cos, sin = _cos_sin(emb)  # each [max_position, head_dim], float32
        self.cos, self.sin = (cos * attn_factor).to(device), (sin * attn_factor).to(device)

    @staticmethod
    def _rotate_half(x: torch.Tensor) -> torch.Tensor:
        a, b = x.chunk(2, dim=-1)
        return torch.cat([-b, a], dim=-1)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """q: [tokens, q_heads, head_dim]; k: [tokens, kv_heads, head_dim], each rotated by its position."""
        cos = self.cos[positions].unsqueeze(1).to(q.dtype)
        sin = self.sin[positions].unsqueeze(1).to(q.dtype)
        return q * cos + self._rotate_half(q) * sin, k * cos + self._rotate_half(k) * sin


class QKNormRope:
    """What attention does to q and k before it attends: Qwen3's per-head RMSNorm (when the model has
    one), then RoPE. The layer hands this to its attention backend, whose plain sequence calls it."""

    def __init__(self, rotary: RotaryEmbedding, q_norm: Optional[RMSNorm] = None, k_norm: Optional[RMSNorm] = None):
        self.rotary, self.q_norm, self.k_norm = rotary, q_norm, k_norm

    def __call__(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return self.rotary(positions, q, k)


def _cos_sin(emb: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """`emb.cos()` and `emb.sin()`, each function first called on one element.

    On the CPU PyTorch hands float `cos`/`sin` to MKL's VML, which picks each function's kernel on its first
    call; when that call is split over the intra-op threads, one thread can run the low-accuracy (VML_EP) kernel
    on its whole chunk (pytorch/pytorch#188792, oneMKL 2024.2): in some fresh processes, cosines of the table's
    second half came out 1.5e-4 off. A one-element call makes the choice on one thread first."""
    one = emb.new_zeros(1)
    one.cos(), one.sin()
    return emb.cos(), emb.sin()
