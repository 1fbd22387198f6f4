"""FlashInfer for prefill, the engine's own Triton kernel for decode, and the steps around
attention fused into fewer launches (CUDA only).

This backend runs the same computation as the base interface's plain sequence (qk-norm, RoPE,
store k and v, attend); only the number of kernels differs:
- every batch: the qk-norm, RoPE and the KV store in one launch (`apply_rope_and_store`);
- decode at head_dim 128 and below: `decode_attention` (one launch a layer, no page list and no
  host plan), which for small batches also does the norm, RoPE and store itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, List, Optional

import torch

from minisgl.kernel import (DecodeScratch, PendingRope, apply_rope_and_store, decode_attention, decode_rope_fits,
                            decode_splits, kernels_enabled, rope_and_store_fits, store_kv)
from minisgl.kernel.decode import LARGE_TILE, SMALL_TILE, DecodeTile
from minisgl.kvcache.mha_pool import MHAKVCache

from .base import BaseAttnMetadata
from .flashinfer_backend import FlashInferAttnBackend, flashinfer_missing_or_problem
from .flashinfer_graphs import FlashInferGraphSupport
from .graph_support import AttnGraphSupport, dummy_row_of, graph_support, padded_rows
from .registry import attention_backend

if TYPE_CHECKING:
    from minisgl.core import Batch
    from minisgl.layers.rotary import QKNormRope


@dataclass(frozen=True)
class DecodeThresholds:
    """Where the decode path changes with the batch size, tuned at head_dim 128 (the measurements
    behind them, with their machine, are in minisgl/benchmark/RESULTS.md)."""

    small_tile_max_bs: int = 4  # up to here the step is launch-bound: the small tile, many splits
    rope_in_kernel_max_bs: int = 63  # up to here the kernel rotates and stores itself (a launch fewer)
    longest_first_max_bs: int = 159  # up to here the longest requests start first (shortest last wave)
    one_split_min_bs: int = 56  # from here each request's keys are one split (no partials to merge)
    min_splits: int = 2  # below one_split_min_bs, at least this many splits a request
    programs_per_sm: int = 4  # ... and enough splits for about this many programs per SM
    max_head_dim: int = 128  # above, the kernel's tiles outgrow the SM: FlashInfer decodes


THRESHOLDS = DecodeThresholds()


@dataclass
class TritonDecodeMetadata(BaseAttnMetadata):
    rows: torch.Tensor  # [bs] int32 page-table rows, on the device, in the kernel's entry order
    kv_lens: torch.Tensor  # [bs] int32 keys per entry, on the device
    splits: int  # pieces each request's keys are cut into
    tile: DecodeTile  # keys per inner step and pipelining depth
    order: Optional[torch.Tensor] = None  # [bs] int32: the request of each entry (None: entry i is request i)

    @property
    def size(self) -> int:
        return self.rows.numel()


# above FlashInfer: where FlashInfer runs, this backend runs (it prefills through FlashInfer)
@attention_backend("triton-decode", priority=2, problem=flashinfer_missing_or_problem)
class TritonDecodeAttnBackend(FlashInferAttnBackend):
    def __init__(self, kv_cache: MHAKVCache, page_table: torch.Tensor, num_qo_heads: int, pad_slot: int = 0,
                 thresholds: DecodeThresholds = THRESHOLDS):
        super().__init__(kv_cache, page_table, num_qo_heads, pad_slot)
        self.thresholds = thresholds
        self.triton_decodes = self.head_dim <= thresholds.max_head_dim and kernels_enabled()
        self._sms = torch.cuda.get_device_properties(self.device).multi_processor_count
        rows = page_table.shape[0] - 1
        pieces = max(bs * self.splits(bs) for bs in range(1, rows + 1))
        group = num_qo_heads // self.num_kv_heads
        self._scratch = DecodeScratch.for_batches(rows, self.num_kv_heads, group, self.head_dim, self._sms,
                                                  self.device, pieces)

    def splits(self, bs: int) -> int:
        """How many splits each request's keys are cut into, for a decode batch of `bs` requests."""
        t = self.thresholds
        if bs <= t.small_tile_max_bs:
            return decode_splits(bs, self.num_kv_heads, self._sms)
        if bs >= t.one_split_min_bs:
            return 1
        return max(t.min_splits, decode_splits(bs, self.num_kv_heads, self._sms, t.programs_per_sm))

    def _decode_metadata(self, rows: List[int], kv_lens: List[int],
                         out: Optional[torch.Tensor] = None) -> TritonDecodeMetadata:
        """Rows, key counts and (longest first) each entry's request, in one copy to the device
        (into `out`, a graph's buffer, if given)."""
        t, bs = self.thresholds, len(rows)
        part = -(-bs // 4) * 4  # each of the three parts 16-byte aligned: one compiled kernel for every size
        listed = t.small_tile_max_bs < bs <= t.longest_first_max_bs
        order = sorted(range(bs), key=kv_lens.__getitem__, reverse=True) if listed else list(range(bs))
        pad = [0] * (part - bs)
        host = torch.tensor([rows[i] for i in order] + pad + [kv_lens[i] for i in order] + pad + order + pad,
                            dtype=torch.int32, pin_memory=True)
        dev = host.to(self.device, non_blocking=True) if out is None else out[: 3 * part].copy_(host, non_blocking=True)
        tile = SMALL_TILE if bs <= t.small_tile_max_bs else LARGE_TILE
        order_dev = dev[2 * part : 2 * part + bs] if listed else None
        return TritonDecodeMetadata(dev[:bs], dev[part : part + bs], self.splits(bs), tile, order_dev)

    def prepare_metadata(self, batch: "Batch") -> None:
        if batch.is_decode and self.triton_decodes:
            rows, kv_lens = [r.table_idx for r in batch.reqs], [r.device_len for r in batch.reqs]
            batch.attn_metadata = self._decode_metadata(rows, kv_lens)
        else:
            super().prepare_metadata(batch)

    # ---- the forward pass: the base class's sequence in fewer launches -----------------------
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: "Batch",
                qk: "QKNormRope") -> torch.Tensor:
        k_flat, v_flat = self._flat[layer_id]
        rope = PendingRope(batch.positions, k, v, batch.out_loc, qk.rotary.cos, qk.rotary.sin, _norm_weights(qk))
        meta = batch.attn_metadata
        decoding = isinstance(meta, TritonDecodeMetadata)
        if decoding and meta.size <= self.thresholds.rope_in_kernel_max_bs and decode_rope_fits(q, rope):
            return self._decode(q, layer_id, meta, rope)
        if not rope_and_store_fits(q, k, v, rope.cos, rope.sin, k_flat, v_flat, rope.qk_norm):
            return super().forward(q, k, v, layer_id, batch, qk)  # the plain sequence, through `attend`
        q = apply_rope_and_store(rope.positions, q, k, v, rope.cos, rope.sin, k_flat, v_flat, rope.out_loc,
                                 rope.qk_norm)
        if decoding:
            return self._decode(q, layer_id, meta)
        return meta.wrapper.run(q, self._paged[layer_id])

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: "Batch") -> torch.Tensor:
        meta = batch.attn_metadata
        if not isinstance(meta, TritonDecodeMetadata):
            return super().attend(q, k, v, layer_id, batch)
        k_flat, v_flat = self._flat[layer_id]
        store_kv(k, v, k_flat, v_flat, batch.out_loc)
        return self._decode(q, layer_id, meta)

    def _decode(self, q: torch.Tensor, layer_id: int, meta: TritonDecodeMetadata,
                rope: Optional[PendingRope] = None) -> torch.Tensor:
        k_flat, v_flat = self._flat[layer_id]
        return decode_attention(q, k_flat, v_flat, self.page_table, meta.rows, meta.kv_lens, self._scratch, meta.splits,
                                tile=meta.tile, rope=rope, order=meta.order)


def _norm_weights(qk: "QKNormRope"):
    """The qk-norm as the fused kernels take it: (q weight, k weight, eps), or None."""
    return None if qk.q_norm is None else (qk.q_norm.weight, qk.k_norm.weight, qk.q_norm.eps)


# ---- CUDA graphs (chapter 18's seam) ------------------------------------------------------------
class TritonDecodeGraphSupport(AttnGraphSupport):
    """The kernel's decode metadata (rows, key counts, entry order) planned into one fixed buffer,
    long enough for the largest captured batch, before each replay."""

    def __init__(self, backend: TritonDecodeAttnBackend, max_bs: int):
        self.backend = backend
        self.decode = torch.zeros(3 * -(-max_bs // 4) * 4, dtype=torch.int32, device=backend.device)

    def prepare_for_replay(self, batch: "Batch", size: int) -> None:
        rows, kv_lens = padded_rows(batch, size, dummy_row_of(self.backend.page_table))
        batch.attn_metadata = self.backend._decode_metadata(rows, kv_lens, out=self.decode)


@graph_support(TritonDecodeAttnBackend)
def triton_decode_graph_support(backend: TritonDecodeAttnBackend, max_bs: int,
                                bs_list: List[int]) -> AttnGraphSupport:
    """The kernel's buffer where it decodes; FlashInfer's wrappers where FlashInfer decodes."""
    if not backend.triton_decodes:
        return FlashInferGraphSupport(backend, max_bs, bs_list)
    return TritonDecodeGraphSupport(backend, max_bs)
