"""Exercise store-kv-kernel (chapter 19): write one step's keys and values into the KV pool.

Write `store_kv_ref` (the PyTorch version, the reference every kernel is tested against) and
`store_kv` (the entry point: Triton kernel on GPUs, your fallback otherwise). The Triton kernel
`engine_store._store_kv_kernel` and the helpers `use_triton`, `next_pow2` are the engine's; use them.
Grade with `python judge.py store-kv-kernel`.
"""

import torch

from minisgl.kernel import store as engine_store  # its _store_kv_kernel exists where Triton does
from minisgl.kernel.util import next_pow2, use_triton  # noqa: F401


def store_kv_ref(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, out_loc: torch.Tensor) -> None:
    """k, v: `[tokens, kv_heads, head_dim]`, possibly strided (a column slice of the qkv output);
    caches: `[slots, kv_heads, head_dim]`; out_loc: `[tokens]` slot ids, int32 or int64.

    Write k[i] to k_cache[out_loc[i]] and v[i] to v_cache[out_loc[i]], in place; touch nothing else.
    """
    raise NotImplementedError("store-kv-kernel: write store_kv_ref")


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, out_loc: torch.Tensor) -> None:
    """The same, choosing the implementation: nothing to do for zero tokens; the Triton kernel when
    `use_triton(k)` (one program per token, `ROW = kv_heads * head_dim`, token strides of k and v
    passed in; each token's `[kv_heads, head_dim]` block must be contiguous); otherwise `store_kv_ref`."""
    raise NotImplementedError("store-kv-kernel: write store_kv")
