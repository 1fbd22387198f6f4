"""Rotary position embedding (rotate-half layout) for queries and keys in one launch, with
Qwen3's per-head RMSNorm folded in when the model has one, and optionally the KV store: the
rotated keys and the values go straight to their slots in the pool instead of through a
separate store kernel.

`RotaryEmbedding.forward` takes about a dozen kernels per layer (two gathers, casts, the half
rotation by `cat`, four products, two sums). Rounding follows the layer: `cos`/`sin` are rounded to
the model dtype first, and each product and the sum are rounded as PyTorch rounds them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from .util import next_pow2, use_triton

try:
    import triton
    import triton.language as tl

    @triton.jit
    def norm_rope(src, w_ptr, d, mask, c, s, eps, HALF: tl.constexpr, NORM: tl.constexpr):
        """Rows of heads at `src + d` (`d`: `[1, BLOCK]` columns of a head of 2 * HALF, rows masked by
        `mask`), optionally RMS-normalised over each head (as `RMSNorm.forward` rounds it, weights at `w_ptr`),
        then rotated by `c` and `s`, the cosine and sine of their position over the full head, in the
        rows' dtype. Each column is read with its rotate-half partner (`d + HALF` modulo the head), so the
        result comes out whole. Shared by the RoPE kernel and the decode kernel that rotates as it attends."""
        ok = mask & (d < 2 * HALF)
        dp = (d + HALF) % (2 * HALF)
        x = tl.load(src + d, mask=ok, other=0.0)
        xp = tl.load(src + dp, mask=ok, other=0.0)
        dt = x.dtype
        if NORM:  # normalise in float32, round, multiply by the weight in dtype
            f, fp = x.to(tl.float32), xp.to(tl.float32)
            inv = tl.rsqrt(tl.sum(f * f, axis=1) / (2 * HALF) + eps)[:, None]
            x = ((f * inv).to(dt) * tl.load(w_ptr + d, mask=d < 2 * HALF, other=0.0)).to(dt)
            xp = ((fp * inv).to(dt) * tl.load(w_ptr + dp, mask=d < 2 * HALF, other=0.0)).to(dt)
        return (x * c).to(dt) + (tl.where(d < HALF, -xp, xp) * s).to(dt)

    @triton.jit
    def _norm_rope_heads(x_ptr, out_ptr, w_ptr, t, row, c, s, stride_t, stride_h, eps, H: tl.constexpr,
                         HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, NORM: tl.constexpr):
        # every head of token t, normalised and rotated: row `row` of a contiguous [rows, H, 2 * HALF] output
        h = tl.arange(0, BLOCK_H)[:, None]
        d = tl.arange(0, BLOCK_D)[None, :]
        o = norm_rope(x_ptr + t * stride_t + h * stride_h, w_ptr, d, h < H, c, s, eps, HALF, NORM)
        tl.store(out_ptr + row * (H * 2 * HALF) + h * (2 * HALF) + d, o, mask=(h < H) & (d < 2 * HALF))

    @triton.jit
    def _rope_kernel(q_ptr, k_ptr, qo_ptr, ko_ptr, pos_ptr, cos_ptr, sin_ptr, qw_ptr, kw_ptr, q_stride_t, q_stride_h,
                     k_stride_t, k_stride_h, cos_stride, eps,
                     v_ptr, vc_ptr, loc_ptr, v_stride_t, v_stride_h,
                     HQ: tl.constexpr, HK: tl.constexpr, HALF: tl.constexpr, BLOCK_HQ: tl.constexpr,
                     BLOCK_HK: tl.constexpr, BLOCK_D: tl.constexpr, NORM: tl.constexpr,
                     STORE: tl.constexpr):
        # one program per token, q heads and k heads in the same launch; outputs are contiguous.
        # STORE: `ko_ptr` is the layer's key cache and k goes to row `loc[t]` of it, and the
        # token's value row is copied to the same row of the value cache `vc_ptr`
        t = tl.program_id(0).to(tl.int64)
        pos = tl.load(pos_ptr + t).to(tl.int64)
        d = tl.arange(0, BLOCK_D)[None, :]
        dt = qo_ptr.dtype.element_ty
        c = tl.load(cos_ptr + pos * cos_stride + d, mask=d < 2 * HALF, other=0.0).to(dt)
        s = tl.load(sin_ptr + pos * cos_stride + d, mask=d < 2 * HALF, other=0.0).to(dt)
        _norm_rope_heads(q_ptr, qo_ptr, qw_ptr, t, t, c, s, q_stride_t, q_stride_h, eps, HQ, HALF, BLOCK_HQ, BLOCK_D,
                         NORM)
        if STORE:
            slot = tl.load(loc_ptr + t).to(tl.int64)
            _norm_rope_heads(k_ptr, ko_ptr, kw_ptr, t, slot, c, s, k_stride_t, k_stride_h, eps, HK, HALF, BLOCK_HK,
                             BLOCK_D, NORM)
            hv = tl.arange(0, BLOCK_HK)[:, None]
            mv = (hv < HK) & (d < 2 * HALF)
            val = tl.load(v_ptr + t * v_stride_t + hv * v_stride_h + d, mask=mv)
            tl.store(vc_ptr + slot * (HK * 2 * HALF) + hv * (2 * HALF) + d, val, mask=mv)
        else:
            _norm_rope_heads(k_ptr, ko_ptr, kw_ptr, t, t, c, s, k_stride_t, k_stride_h, eps, HK, HALF, BLOCK_HK,
                             BLOCK_D, NORM)

except ImportError:  # pragma: no cover
    triton = None


@dataclass
class PendingRope:
    """A decode step's keys and values as the QKV projection left them, for a kernel that applies the
    norms and RoPE and stores them on its way (`decode_attention`): what `apply_rope_and_store` takes
    besides q and the caches. k and v `[tokens, kv_heads, head_dim]` (rows may be strided views of the
    projection's output); positions and out_loc `[tokens]`; cos and sin `[max_pos, head_dim]` float32;
    qk_norm: (q weight, k weight, eps) for a model that normalises each head (Qwen3), else None."""

    positions: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    out_loc: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    qk_norm: Optional[Tuple[torch.Tensor, torch.Tensor, float]] = None


def rope_fits(q: torch.Tensor, k: torch.Tensor, cos_cache: torch.Tensor, sin_cache: torch.Tensor,
              qk_norm: Optional[Tuple[torch.Tensor, torch.Tensor, float]] = None) -> bool:
    """Whether `apply_rope` takes these: Triton on q's device, unit-stride heads of an even width, rotation
    tables in rows, qk-norm weights contiguous in q's dtype."""
    ok = use_triton(q) and q.dim() == 3 and k.dim() == 3 and q.stride(-1) == 1 and k.stride(-1) == 1
    ok = ok and q.shape[-1] % 2 == 0 and cos_cache.stride(-1) == 1 and sin_cache.stride() == cos_cache.stride()
    return ok and (qk_norm is None or (qk_norm[0].dtype == q.dtype and all(w.is_contiguous() for w in qk_norm[:2])))


def _launch(positions, q, k, q_out, k_out, cos_cache, sin_cache, qk_norm, store=None) -> None:
    t, hq, d = q.shape
    hk = k.shape[1]
    qw, kw, eps = qk_norm if qk_norm is not None else (q, k, 0.0)  # weights unused without the norm
    v, v_cache, loc = store if store is not None else (k, k_out, positions)  # unused without the store
    _rope_kernel[(t,)](
        q, k, q_out, k_out, positions, cos_cache, sin_cache, qw, kw,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos_cache.stride(0), eps,
        v, v_cache, loc, v.stride(0), v.stride(1),
        HQ=hq, HK=hk, HALF=d // 2, BLOCK_HQ=next_pow2(hq), BLOCK_HK=next_pow2(hk), BLOCK_D=next_pow2(d),
        NORM=qk_norm is not None,
        STORE=store is not None,
    )


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
    assert rope_fits(q, k, cos_cache, sin_cache, qk_norm)
    t, hq, d = q.shape
    q_out = torch.empty(t, hq, d, dtype=q.dtype, device=q.device)
    k_out = torch.empty(t, k.shape[1], d, dtype=k.dtype, device=k.device)
    if t > 0:
        _launch(positions, q, k, q_out, k_out, cos_cache, sin_cache, qk_norm)
    return q_out, k_out


def rope_and_store_fits(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos_cache: torch.Tensor,
                        sin_cache: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        qk_norm: Optional[Tuple[torch.Tensor, torch.Tensor, float]] = None) -> bool:
    """Whether `apply_rope_and_store` takes these: `rope_fits`, and contiguous caches of k's heads and dtype."""
    ok = rope_fits(q, k, cos_cache, sin_cache, qk_norm) and k_cache.is_contiguous()
    ok = ok and v_cache.is_contiguous() and v.dim() == 3 and v.stride(-1) == 1 and v.shape == k.shape
    ok = ok and k_cache.shape[1:] == k.shape[1:] and v_cache.shape == k_cache.shape
    return ok and k_cache.dtype == v_cache.dtype == k.dtype == v.dtype


def apply_rope_and_store(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos_cache: torch.Tensor,
    sin_cache: torch.Tensor,
    k_cache: torch.Tensor, v_cache: torch.Tensor, out_loc: torch.Tensor, qk_norm: Optional[Tuple[torch.Tensor,
                                                                                                 torch.Tensor,
                                                                                                 float]] = None,
) -> torch.Tensor:
    """`apply_rope`, then the rotated k and v written to slots `out_loc` of the caches
    (`[slots, kv_heads, head_dim]`, as `store_kv` writes them); returns the rotated q. On the
    GPU one launch does it all, and the rotated k is never written anywhere but the pool."""
    assert rope_and_store_fits(q, k, v, cos_cache, sin_cache, k_cache, v_cache, qk_norm)
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if q.shape[0] > 0:
        _launch(positions, q, k, q_out, k_cache, cos_cache, sin_cache, qk_norm, (v, v_cache, out_loc))
    return q_out
