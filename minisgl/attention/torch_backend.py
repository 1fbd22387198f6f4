"""Attention in plain PyTorch over the paged KV pool: runs on CPU and CUDA; the reference."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, List, Optional, Tuple

import torch
import torch.nn.functional as F

from minisgl.kvcache.mha_pool import MHAKVCache

from .base import BaseAttnBackend, BaseAttnMetadata
from .registry import attention_backend

if TYPE_CHECKING:
    from minisgl.core import Batch


@dataclass
class TorchAttnMetadata(BaseAttnMetadata):
    q_starts: List[int]  # where each request's queries begin in the flat token dimension
    cached_lens: List[int]
    kv_lens: List[int]  # device_len per request: keys attended to
    kv_slots: torch.Tensor  # [bs, max_kv_len] slots, padded with the zeroed pad slot
    kv_mask: torch.Tensor  # [bs, max_kv_len] True where the key exists


class TorchAttnBackend(BaseAttnBackend):
    def __init__(self, kv_cache: MHAKVCache, page_table: torch.Tensor, pad_slot: int = 0):
        self.kv_cache = kv_cache
        self.page_table = page_table  # [rows, max_seq_len] slot of each position
        self.pad_slot = pad_slot  # a zeroed slot that padding reads, so no garbage (NaN) leaks in
        self._scratch: Optional[torch.Tensor] = None  # [2, tokens, kv_heads, dim]: see `_gather`

    def prepare_metadata(self, batch: "Batch") -> None:
        rows = torch.tensor([r.table_idx for r in batch.reqs], device=self.page_table.device)
        kv_lens = [r.device_len for r in batch.reqs]
        max_len = max(kv_lens)
        lens = torch.tensor(kv_lens, device=self.page_table.device)
        mask = torch.arange(max_len, device=lens.device)[None, :] < lens[:, None]
        slots = self.page_table[rows, :max_len].masked_fill(~mask, self.pad_slot).long()
        q_starts, start = [], 0
        for r in batch.reqs:
            q_starts.append(start)
            start += r.extend_len
        batch.attn_metadata = TorchAttnMetadata(q_starts, [r.cached_len for r in batch.reqs], kv_lens, slots, mask)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: "Batch") -> torch.Tensor:
        self.kv_cache.store_kv(k, v, batch.out_loc, layer_id)
        meta: TorchAttnMetadata = batch.attn_metadata
        if batch.is_decode:
            return self._decode(q, layer_id, meta)
        out = torch.empty_like(q)
        for i, (start, cached, kv_len) in enumerate(zip(meta.q_starts, meta.cached_lens, meta.kv_lens)):
            n = kv_len - cached
            qi = q[start : start + n]
            if cached == 0:
                # no prefix: the keys are exactly this step's, so take them here, not from the pool
                out[start : start + n] = _attend(qi, k[start : start + n], v[start : start + n], is_causal=True)
            else:
                ki, vi = self._gather(layer_id, meta.kv_slots[i, :kv_len])
                # query i sits at position cached + i and sees keys 0..cached + i
                allowed = torch.arange(kv_len, device=q.device)[None,
                                                                :] <= (cached + torch.arange(n, device=q.device))[:,
                                                                                                                  None]
                out[start : start + n] = _attend(qi, ki, vi, attn_mask=allowed)
        return out

    def _decode(self, q: torch.Tensor, layer_id: int, meta: TorchAttnMetadata) -> torch.Tensor:
        bs, max_len = meta.kv_slots.shape
        k, v = self._gather(layer_id, meta.kv_slots.view(-1))
        ks = k.view(bs, max_len, *k.shape[1:]).transpose(1, 2)  # [bs, kv_heads, max_len, dim]
        vs = v.view(bs, max_len, *v.shape[1:]).transpose(1, 2)
        qs = q.unsqueeze(2)  # [bs, heads, 1, dim]
        out = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=meta.kv_mask[:, None, None, :], enable_gqa=True)
        return out.squeeze(2)

    def _gather(self, layer_id: int, slots: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """The keys and values at `slots` (1-D), `[len(slots), kv_heads, dim]` each, copied into a
        scratch buffer that every layer and step reuses (each call overwrites the last one's).
        On the CPU a fresh tensor this large per layer cost more than the copy itself: the
        allocator maps big blocks anew and every page faults on first touch."""
        n = slots.numel()
        if self._scratch is None or self._scratch.shape[1] < n:
            # headroom: a decode batch reads one more key per request each step
            self._scratch = self.kv_cache.buffer.new_empty((2, n + n // 2, self.kv_cache.num_kv_heads,
                                                            self.kv_cache.head_dim))
        k = torch.index_select(self.kv_cache.k_cache(layer_id), 0, slots, out=self._scratch[0, :n])
        v = torch.index_select(self.kv_cache.v_cache(layer_id), 0, slots, out=self._scratch[1, :n])
        return k, v


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **mask: object) -> torch.Tensor:
    """SDPA over one request's `[len, heads, dim]` tensors, as 4-D `[1, heads, len, dim]`: with a
    batch dimension SDPA takes its fused (flash) kernel on the CPU too; 3-D inputs fall back to
    the math path, which materialises the `[heads, n, kv_len]` score matrix (7x slower at 4k tokens)."""
    q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **mask)[0].transpose(0, 1)


@attention_backend("torch", priority=0)  # the lowest: "auto" takes it where no faster backend runs
def make_torch_backend(kv_cache: MHAKVCache, page_table: torch.Tensor, pad_slot: int = 0,
                       **unused: object) -> TorchAttnBackend:
    """The torch backend from the engine's keyword arguments; what only GPU backends take (the number of
    query heads) it does not need: it reads the shapes off each batch."""
    return TorchAttnBackend(kv_cache, page_table, pad_slot)
