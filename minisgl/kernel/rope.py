"""Rotary position embedding (rotate-half layout) for queries and keys in one launch, with
Qwen3's per-head RMSNorm folded in when the model has one.

The PyTorch path takes about a dozen kernels per layer (two gathers, casts, the half rotation
by `cat`, four products, two sums). Rounding follows the reference: `cos`/`sin` are rounded to
the model dtype first, and each product and the sum are rounded as PyTorch rounds them.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from .norm import rmsnorm_ref
from .util import next_pow2, use_triton

try:
    import triton
    import triton.language as tl

    @triton.jit
    def _norm_rope_heads(x_ptr, out_ptr, w_ptr, t, c, s, stride_t, stride_h, eps, H: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, NORM: tl.constexpr):
        # every head of token t: optional RMSNorm over the head (both halves), then the rotation
        h = tl.arange(0, BLOCK_H)[:, None]
        d = tl.arange(0, BLOCK_D)[None, :]
        mask = (h < H) & (d < HALF)
        src = x_ptr + t * stride_t + h * stride_h + d
        x1 = tl.load(src, mask=mask, other=0.0)
        x2 = tl.load(src + HALF, mask=mask, other=0.0)
        dt = x1.dtype
        if NORM:  # as rmsnorm_ref: normalise in float32, round, multiply by the weight in dtype
            f1, f2 = x1.to(tl.float32), x2.to(tl.float32)
            inv = tl.rsqrt((tl.sum(f1 * f1, axis=1) + tl.sum(f2 * f2, axis=1)) / (2 * HALF) + eps)[:, None]
            w1 = tl.load(w_ptr + d, mask=d < HALF, other=0.0)
            w2 = tl.load(w_ptr + HALF + d, mask=d < HALF, other=0.0)
            x1 = ((f1 * inv).to(dt) * w1).to(dt)
            x2 = ((f2 * inv).to(dt) * w2).to(dt)
        o1 = (x1 * c).to(dt) + (-x2 * s).to(dt)
        o2 = (x2 * c).to(dt) + (x1 * s).to(dt)
        dst = out_ptr + t * (H * 2 * HALF) + h * (2 * HALF) + d
        tl.store(dst, o1.to(dt), mask=mask)
        tl.store(dst + HALF, o2.to(dt), mask=mask)

    @triton.jit
    def _rope_kernel(q_ptr, k_ptr, qo_ptr, ko_ptr, pos_ptr, cos_ptr, sin_ptr, qw_ptr, kw_ptr, q_stride_t, q_stride_h, k_stride_t, k_stride_h, cos_stride, eps,
                     HQ: tl.constexpr, HK: tl.constexpr, HALF: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_D: tl.constexpr, NORM: tl.constexpr):
        # one program per token, q heads and k heads in the same launch; outputs are contiguous
        t = tl.program_id(0).to(tl.int64)
        pos = tl.load(pos_ptr + t).to(tl.int64)
        d = tl.arange(0, BLOCK_D)[None, :]
        dt = qo_ptr.dtype.element_ty
        c = tl.load(cos_ptr + pos * cos_stride + d, mask=d < HALF, other=0.0).to(dt)
        s = tl.load(sin_ptr + pos * cos_stride + d, mask=d < HALF, other=0.0).to(dt)
        _norm_rope_heads(q_ptr, qo_ptr, qw_ptr, t, c, s, q_stride_t, q_stride_h, eps, HQ, HALF, BLOCK_HQ, BLOCK_D, NORM)
        _norm_rope_heads(k_ptr, ko_ptr, kw_ptr, t, c, s, k_stride_t, k_stride_h, eps, HK, HALF, BLOCK_HK, BLOCK_D, NORM)

except ImportError:  # pragma: no cover
    triton = None


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


def apply_rope_ref(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_cache: torch.Tensor, sin_cache: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """q: `[tokens, q_heads, dim]`, k: `[tokens, kv_heads, dim]`; caches: `[max_pos, dim]` float32."""
    cos = cos_cache[positions].unsqueeze(1).to(q.dtype)
    sin = sin_cache[positions].unsqueeze(1).to(q.dtype)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def apply_rope(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_cache: torch.Tensor,
    sin_cache: torch.Tensor,
    qk_norm: Optional[Tuple[torch.Tensor, torch.Tensor, float]] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Rotate q and k by their token's position; returns new contiguous tensors.

    `qk_norm = (q_weight, k_weight, eps)` first RMS-normalises every head (Qwen3's qk-norm) in
    the same launch, so a layer spends one kernel on what took four."""
    ok = use_triton(q) and q.dim() == 3 and k.dim() == 3 and q.stride(-1) == 1 and k.stride(-1) == 1
    ok = ok and q.shape[-1] % 2 == 0 and cos_cache.stride(-1) == 1 and sin_cache.stride() == cos_cache.stride()
    ok = ok and (qk_norm is None or (qk_norm[0].dtype == q.dtype and qk_norm[0].is_contiguous() and qk_norm[1].is_contiguous()))
    if not ok:
        if qk_norm is not None:
            q, k = rmsnorm_ref(q, qk_norm[0], qk_norm[2]), rmsnorm_ref(k, qk_norm[1], qk_norm[2])
        return apply_rope_ref(positions, q, k, cos_cache, sin_cache)
    t, hq, d = q.shape
    hk = k.shape[1]
    q_out = torch.empty(t, hq, d, dtype=q.dtype, device=q.device)
    k_out = torch.empty(t, hk, d, dtype=k.dtype, device=k.device)
    if t == 0:
        return q_out, k_out
    qw, kw, eps = qk_norm if qk_norm is not None else (q, k, 0.0)  # weights unused without the norm
    _rope_kernel[(t,)](
        q, k, q_out, k_out, positions, cos_cache, sin_cache, qw, kw,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos_cache.stride(0), eps,
        HQ=hq, HK=hk, HALF=d // 2, BLOCK_HQ=next_pow2(hq), BLOCK_HK=next_pow2(hk), BLOCK_D=next_pow2(d // 2), NORM=qk_norm is not None,
    )
    return q_out, k_out
