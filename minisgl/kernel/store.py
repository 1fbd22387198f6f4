"""Write one step's keys and values into the KV pool: one launch for both, instead of two
`index_copy_` calls per layer."""

from __future__ import annotations

import torch

from .util import next_pow2, use_triton

try:
    import triton
    import triton.language as tl

    @triton.jit
    def _store_kv_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, loc_ptr, k_stride, v_stride, ROW: tl.constexpr,
                         BLOCK: tl.constexpr):
        # one program per token: copy its [kv_heads * head_dim] key row and value row to its slot
        t = tl.program_id(0).to(tl.int64)
        slot = tl.load(loc_ptr + t).to(tl.int64)
        for start in tl.static_range(0, ROW, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            mask = offs < ROW
            k = tl.load(k_ptr + t * k_stride + offs, mask=mask)
            v = tl.load(v_ptr + t * v_stride + offs, mask=mask)
            tl.store(k_cache_ptr + slot * ROW + offs, k, mask=mask)
            tl.store(v_cache_ptr + slot * ROW + offs, v, mask=mask)

except ImportError:  # pragma: no cover
    triton = None


def store_kv_ref(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 out_loc: torch.Tensor) -> None:
    """k, v: `[tokens, kv_heads, head_dim]`; caches: `[slots, kv_heads, head_dim]`; out_loc: `[tokens]`."""
    k_cache.index_copy_(0, out_loc.long(), k)
    v_cache.index_copy_(0, out_loc.long(), v)


def _row_stride(x: torch.Tensor) -> int:
    # each token's [kv_heads, head_dim] block must be contiguous; tokens may be strided
    # (v is a column slice of the fused qkv output)
    assert x.stride(2) == 1 and x.stride(1) == x.shape[2], "each token's heads must be contiguous"
    return x.stride(0)


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             out_loc: torch.Tensor) -> None:
    """Write `k[i]`, `v[i]` to slot `out_loc[i]` of the caches (in place)."""
    n = k.shape[0]
    if n == 0:
        return
    if not use_triton(k):
        store_kv_ref(k, v, k_cache, v_cache, out_loc)
        return
    assert k_cache.is_contiguous() and v_cache.is_contiguous()
    row = k.shape[1] * k.shape[2]
    block = min(next_pow2(row), 4096)
    _store_kv_kernel[(n,)](k, v, k_cache, v_cache, out_loc, _row_stride(k), _row_stride(v), ROW=row, BLOCK=block)
