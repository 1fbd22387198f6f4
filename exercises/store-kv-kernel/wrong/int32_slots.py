"""Wrong: passes `out_loc` to `index_copy_` as it comes; the scheduler's slots are int32 and
`index_copy_` wants int64 indices."""

import torch

from minisgl.kernel import store as engine_store  # its _store_kv_kernel exists where Triton does
from minisgl.kernel.util import next_pow2, use_triton


def store_kv_ref(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, out_loc: torch.Tensor) -> None:
    k_cache.index_copy_(0, out_loc, k)
    v_cache.index_copy_(0, out_loc, v)


def _row_stride(x: torch.Tensor) -> int:
    # each token's [kv_heads, head_dim] block must be contiguous; tokens may be strided
    assert x.stride(2) == 1 and x.stride(1) == x.shape[2], "each token's heads must be contiguous"
    return x.stride(0)


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, out_loc: torch.Tensor) -> None:
    n = k.shape[0]
    if n == 0:
        return
    if not use_triton(k):
        store_kv_ref(k, v, k_cache, v_cache, out_loc)
        return
    assert k_cache.is_contiguous() and v_cache.is_contiguous()
    row = k.shape[1] * k.shape[2]
    block = min(next_pow2(row), 4096)
    engine_store._store_kv_kernel[(n,)](k, v, k_cache, v_cache, out_loc, _row_stride(k), _row_stride(v), ROW=row, BLOCK=block)
