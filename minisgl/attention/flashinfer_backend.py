"""Attention through FlashInfer's paged kernels (CUDA only).

FlashInfer reads the KV pool in place, through a CSR list of pages per request:
`kv_indptr[i] : kv_indptr[i + 1]` delimits request i's entries in `kv_indices`, each entry a
page number (a slot of the page's first position divided by the page size), and
`kv_last_page_len[i]` says how many positions of its last page are filled. Prefill (and the
extend of a cached prefix or a prompt chunk) uses the causal mask aligned to the end of each
request's keys; decode has one query per request.

A wrapper is *planned* once per batch on the host (FlashInfer decides how to split the work)
and then *run* once per layer. Decode wrappers for CUDA graphs own fixed buffers, one wrapper
per captured batch size, and are re-planned before every replay.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

import numpy as np
import torch

from minisgl.kernel import LARGE_BATCH_BLOCK, LARGE_BATCH_STAGES, DecodeScratch, PendingRope, decode_attention, decode_splits, gather_page_indices, merge_pieces, store_kv
from minisgl.kvcache.mha_pool import MHAKVCache

from .base import BaseAttnBackend, BaseAttnMetadata
FLASHINFER_HEAD_DIMS, FLASHINFER_DTYPES = (64, 128, 256), (torch.float16, torch.bfloat16)  # what its kernels are built for

if TYPE_CHECKING:
    from minisgl.core import Batch

_WORKSPACE_BYTES = 256 << 20  # FlashInfer's scratch for split-KV partial results
# Decode on tensor cores (FlashInfer's prefill kernel with one query per request) against the
# CUDA-core decode kernel, Qwen3-0.6B shape (2 query heads per KV head) on an H200: 10% faster
# attention alone at 256 requests x ~1100 keys (307 vs 336 us per layer), but a slower whole
# decode step at 256 requests x ~550 keys (7.3-7.6 vs 6.6 ms) and at 16 requests (2.1 vs 1.9 ms),
# and, with the keys in pieces (below), a 24% slower offline workload. CUDA cores stay the default.
DECODE_TENSOR_CORES = False
# Up to this many requests a decode step's attention is `minisgl.kernel.decode_attention` (one
# launch, split and merged in the kernel) at its small-batch tile, about DECODE_PROGRAMS_PER_SM programs
# per SM: the step is then bound by the launches' latency, not by reading the keys.
SMALL_DECODE_MAX_BS = 4
# From this many requests, where FlashInfer decodes large batches (head_dim above 128, or
# LARGE_DECODE_MIN_BS raised), a decode step gives it each request's keys as up to DECODE_PIECES
# consecutive pieces, each attended to as a request of its own, and `merge_pieces` joins them. Planned
# for CUDA graphs, FlashInfer's decode splits the keys itself below one wave of its grid (about 149
# requests at 8 KV heads on an H200), merging in a second kernel even where nothing needed splitting;
# above it, one program holds all of a request's keys for a KV head and the grid's last wave runs
# part-empty. In pieces, attention alone was 5-9% faster from 96 requests up, slower at 64, and the
# offline workload's decode steps of 65-192 requests 5-6% shorter (minisgl/benchmark/RESULTS.md,
# "Keys in pieces, kept; projections of 3-256 rows, not").
DECODE_PIECES = 4
DECODE_PIECES_MIN_BS = 96
# From this many requests (at head_dim <= 128) a decode step's attention is `decode_attention` again,
# with its large-batch tile: one launch a layer, no page list and no host plan, and no pieces to gather
# queries for and merge. At the offline workload's lengths on an H200 it took 66.1 against 71.4 us a layer
# at 64 requests, 114.7 against 121.8 at 128 and 210.5 against 214.9 at 256 (FlashInfer over pieces, with
# the merge; minisgl/benchmark/RESULTS.md, "The Triton decode kernel from 64 requests"), and with the RoPE
# launch folded in (below) 14.2-66.1 against 17.5-71.1 us for RoPE plus FlashInfer's decode at 8-63
# requests ("RoPE inside the decode kernel"). So FlashInfer decodes only models whose heads it alone
# serves (head_dim above 128), or batches of LARGE_DECODE_MIN_BS raised, as tests do.
LARGE_DECODE_MIN_BS = SMALL_DECODE_MAX_BS + 1
# Below LARGE_DECODE_ONE_SPLIT_MIN_BS each request's keys in at least LARGE_DECODE_SPLITS splits, and
# enough splits for about LARGE_DECODE_PROGRAMS_PER_SM programs per SM: the best split count of 1-16 at
# every measured batch of 8-48 requests on an H200 (8 splits at 8 requests, 4 at 12-16, 2 from 24).
LARGE_DECODE_SPLITS = 2
LARGE_DECODE_PROGRAMS_PER_SM = 4
# From this many requests each request's keys are one split: its program writes the output itself (no
# partials, counter or merge; the same bits). One split against two took 56.5 / 63.8 us a layer at 56 requests
# (RoPE folded in), 54.9 / 60.8 at 64 and 75.3 / 85.1 at 96 with the requests longest first (below), and 206.5 /
# 214.9 at 256 as they come; at 48, listed, 50.3 / 47.9 (`tools/gpu_probes/decode_longest_first.py`;
# minisgl/benchmark/RESULTS.md, "The longest requests first, and one split from 56 requests").
LARGE_DECODE_ONE_SPLIT_MIN_BS = 56
# Up to this many requests the decode kernel also applies the norms and RoPE to q and this step's k and
# stores k and v itself (`forward_rotating`), one launch a layer fewer: 10.7 -> 9.2 us a layer at one
# request, 17.5 -> 14.2 at 8 (against FlashInfer), 71.1 -> 66.1 at 63. From 64 requests the separate RoPE
# launch is faster (214.5 against 219.4 us at 256): every program's longer start (rotating its queries, the
# last split writing the new key before reading) costs more than the launch it saves.
ROPE_IN_DECODE_MAX_BS = 63
# The decode kernel's programs start in the order of its entries, and with a few programs an SM the grid's
# last wave decides when a layer ends. From LARGE_DECODE_MIN_BS up to this many requests the entries list
# the requests longest first (the page table's rows and key counts in that order, and where each request's
# query and output are), so that wave holds the shortest programs, not whichever requests came last. At the
# offline workload's lengths: 36.2 against 41.9 us a layer at 32 requests (two splits), 54.9 against 61.8 at
# 64 and 101.7 against 108.2 at 128 (one split); equal at 16 and 224-256, and through the engine the decode
# steps of 193-256 requests were 2-3% slower with them listed, so from 160 requests they come as they are.
DECODE_LONGEST_FIRST_MAX_BS = 159


def large_decode_splits(bs: int, num_kv_heads: int, num_sms: int) -> int:
    """Splits per request for the decode kernel at its large-batch tile: one from LARGE_DECODE_ONE_SPLIT_MIN_BS
    requests; below, at least LARGE_DECODE_SPLITS, and more where that makes about
    LARGE_DECODE_PROGRAMS_PER_SM programs per SM."""
    if bs >= LARGE_DECODE_ONE_SPLIT_MIN_BS:
        return 1
    return max(LARGE_DECODE_SPLITS, decode_splits(bs, num_kv_heads, num_sms, LARGE_DECODE_PROGRAMS_PER_SM))


@dataclass
class KeyPieces:
    """A decode batch whose keys FlashInfer sees as pieces, one query row each, on the device."""

    owner: torch.Tensor  # [pieces] int32: the request whose query each piece uses
    part_start: torch.Tensor  # [bs + 1] int32: request r's pieces are part_start[r] : part_start[r + 1]


@dataclass
class FlashInferMetadata(BaseAttnMetadata):
    wrapper: object  # a planned BatchPrefill/BatchDecode wrapper
    num_pages: int  # pages referenced by the batch (for inspection and tests)
    pieces: Optional[KeyPieces] = None  # decode of many requests: merge the pieces after the run


@dataclass
class SmallDecodeMetadata(BaseAttnMetadata):
    rows: torch.Tensor  # [bs] int32 page-table rows, on the device, in the kernel's entry order
    kv_lens: torch.Tensor  # [bs] int32 keys per entry, on the device
    splits: int  # pieces each request's keys are cut into (see `decode_splits`)
    large: bool = False  # a batch of LARGE_DECODE_MIN_BS or more: the large-batch tile
    order: Optional[torch.Tensor] = None  # [bs] int32: the request of each entry (None: entry i is request i)


@dataclass
class PageLayout:
    """The CSR page list of a batch, built on the host (pinned) and mirrored on the device."""

    indptr_host: torch.Tensor  # [bs + 1] int32, pinned
    last_page_len_host: torch.Tensor  # [bs] int32, pinned
    indices: torch.Tensor  # [total] int32 page numbers, on the device
    total: int


def page_layout(kv_lens: List[int], page_size: int) -> Tuple[List[int], List[int]]:
    """FlashInfer's view of a batch: `kv_indptr` (`[bs + 1]`, running page counts) and
    `kv_last_page_len` (`[bs]`, filled positions of each last page, between 1 and page_size)."""
    pages = [(n + page_size - 1) // page_size for n in kv_lens]
    indptr = [0, *itertools.accumulate(pages)]
    last = [n - (p - 1) * page_size for n, p in zip(kv_lens, pages)]
    return indptr, last


class FlashInferAttnBackend(BaseAttnBackend):
    def __init__(
        self,
        kv_cache: MHAKVCache,
        page_table: torch.Tensor,
        num_qo_heads: Optional[int] = None,
        pad_slot: int = 0,
        decode_tensor_cores: Optional[bool] = None,
        small_decode_max_bs: int = SMALL_DECODE_MAX_BS,
        decode_pieces: Optional[int] = None,
        decode_pieces_min_bs: Optional[int] = None,
        large_decode_min_bs: Optional[int] = None,
        decode_longest_first_max_bs: Optional[int] = None,
    ):
        import flashinfer

        problem = flashinfer_problem(page_table.device, kv_cache.buffer.dtype, kv_cache.head_dim)
        if problem is not None:  # the same rule "auto" applies before choosing this backend
            raise ValueError(f"the FlashInfer backend cannot run here: {problem}; use attention_backend='auto' or 'torch'")
        if num_qo_heads is None:
            raise ValueError("FlashInferAttnBackend needs num_qo_heads (the engine passes the model's query heads per rank)")
        self._fi = flashinfer
        self.kv_cache = kv_cache
        self.page_table = page_table  # [rows + 1 dummy, max_seq_len] slot of each position
        self.device = page_table.device
        self.page_size = kv_cache.page_size
        self.num_qo_heads = num_qo_heads
        self.num_kv_heads = kv_cache.num_kv_heads
        self.head_dim = kv_cache.head_dim
        self.dtype = kv_cache.buffer.dtype
        self.dummy_row = page_table.shape[0] - 1  # padding requests read this row: the dummy page
        self.pad_slot = pad_slot
        self.decode_tensor_cores = DECODE_TENSOR_CORES if decode_tensor_cores is None else decode_tensor_cores
        self.decode_pieces = DECODE_PIECES if decode_pieces is None else decode_pieces  # 1: whole requests
        self.decode_pieces_min_bs = DECODE_PIECES_MIN_BS if decode_pieces_min_bs is None else decode_pieces_min_bs
        self.longest_first_max_bs = DECODE_LONGEST_FIRST_MAX_BS if decode_longest_first_max_bs is None else decode_longest_first_max_bs
        self.dummy_page = pad_slot // kv_cache.page_size  # what padding requests and empty pieces read
        ps, h, d = self.page_size, self.num_kv_heads, self.head_dim
        # per layer: the flat [slots, heads, dim] views we write to, the paged views FlashInfer reads
        self._flat = [(kv_cache.k_cache(i), kv_cache.v_cache(i)) for i in range(kv_cache.num_layers)]
        self._paged = [(k.view(-1, ps, h, d), v.view(-1, ps, h, d)) for k, v in self._flat]
        self.workspace = torch.empty(_WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        # tuned on the GPU at head_dim 128; at 256 a program's key and value tiles would double,
        # so FlashInfer keeps those models' decode at every batch size
        self.small_decode_max_bs = small_decode_max_bs if self.head_dim <= 128 else 0
        large = LARGE_DECODE_MIN_BS if large_decode_min_bs is None else large_decode_min_bs
        self.large_decode_min_bs = large if self.head_dim <= 128 else 1 << 30
        self._sms = torch.cuda.get_device_properties(self.device).multi_processor_count
        rows = page_table.shape[0] - 1
        large_rows = rows if self.large_decode_min_bs <= rows else 0  # room for a batch of every row of the table
        large_pieces = max((bs * large_decode_splits(bs, self.num_kv_heads, self._sms) for bs in range(self.large_decode_min_bs, large_rows + 1)), default=0)
        self._small_scratch = DecodeScratch.for_batches(self.small_decode_max_bs, h, num_qo_heads // h, d, self._sms, self.device,
                                                        pieces=large_pieces, rows=large_rows)
        self.prefill_wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD", backend="fa2")
        self.decode_wrapper = self._make_decode_wrapper(None)
        self._graph_wrappers: Dict[int, object] = {}
        # plan() stages its schedule in a pinned host buffer and copies it asynchronously; the
        # next plan must not overwrite that buffer before the copy has run on the GPU
        self._plan_copied = torch.cuda.Event()

    # ---- planning ----------------------------------------------------------------------------
    def _make_decode_wrapper(self, graph_bs: Optional[int]):
        kwargs = {}
        if graph_bs is not None:
            n = graph_bs * self._pieces_for(graph_bs)  # the requests FlashInfer sees: pieces, if cut
            kwargs = dict(
                use_cuda_graph=True,
                paged_kv_indptr_buffer=self._cg_indptr[: n + 1],
                paged_kv_indices_buffer=self._cg_indices,
                paged_kv_last_page_len_buffer=self._cg_last_page_len[:n],
            )
        return self._fi.BatchDecodeWithPagedKVCacheWrapper(self.workspace, "NHD", use_tensor_cores=self.decode_tensor_cores, **kwargs)

    def _pieces_for(self, bs: int) -> int:
        return self.decode_pieces if bs >= self.decode_pieces_min_bs else 1

    def _layout(self, rows: List[int], kv_lens: List[int], extra: int = 0) -> PageLayout:
        """The batch's page list; `extra` more entries at its end read the dummy page."""
        ps = self.page_size
        indptr, last = page_layout(kv_lens, ps)
        bs = len(rows)
        # one pinned buffer, one copy; `rows` starts 16-byte aligned so the kernel compiled for
        # aligned pointers serves every batch size
        gap = -(2 * bs + 1) % 4
        host = torch.tensor(indptr + last + [0] * gap + rows, dtype=torch.int32, pin_memory=True)
        dev = host.to(self.device, non_blocking=True)
        total = indptr[-1]
        max_pages = max(b - a for a, b in zip(indptr, indptr[1:]))
        indices = torch.empty(total + extra, dtype=torch.int32, device=self.device)
        gather_page_indices(self.page_table, dev[2 * bs + 1 + gap :], dev[: bs + 1], ps, total, max_pages, out=indices)
        if extra:
            indices[total:] = self.dummy_page
        return PageLayout(host[: bs + 1], host[bs + 1 : 2 * bs + 1], indices, total)

    def _cut_into_pieces(self, layout: PageLayout, pieces: int, fill_to: int, out: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor, KeyPieces]:
        """FlashInfer's view of the batch with request i's pages cut into min(pieces, pages) runs of
        near-equal length, in order (the page list itself is unchanged), then padding pieces of one
        dummy page up to `fill_to` (a graph's fixed size). Returns the pieces' indptr and last-page
        fill (host) and, on the device (in `out`, a graph's buffer, if given), who owns each piece."""
        pages = np.diff(layout.indptr_host.numpy())
        bs = len(pages)
        count = np.minimum(pieces, pages)  # a piece holds at least one page
        first = np.cumsum(count) - count
        owner = np.repeat(np.arange(bs), count)
        j = np.arange(len(owner)) - first[owner]  # piece number within its request
        size = (j + 1) * pages[owner] // count[owner] - j * pages[owner] // count[owner]
        last = np.where(j == count[owner] - 1, layout.last_page_len_host.numpy()[owner], self.page_size)
        pad = fill_to - len(owner)
        assert pad >= 0, f"{len(owner)} pieces for a wrapper of {fill_to}"
        size, last, owner = (np.concatenate([a, np.full(pad, v)]) for a, v in ((size, 1), (last, 1), (owner, 0)))
        indptr = torch.from_numpy(np.concatenate([[0], np.cumsum(size)]).astype(np.int32))
        host = torch.from_numpy(np.concatenate([owner, [0], np.cumsum(count)]).astype(np.int32)).pin_memory()
        dev = host.to(self.device, non_blocking=True) if out is None else out[: len(host)].copy_(host, non_blocking=True)
        n = len(owner)
        return indptr, torch.from_numpy(last.astype(np.int32)), KeyPieces(dev[:n], dev[n:])

    def _plan_decode(self, wrapper, rows: List[int], kv_lens: List[int], fill_to: int = 0, out: Optional[torch.Tensor] = None) -> FlashInferMetadata:
        pieces = self._pieces_for(len(rows))
        fill_to = fill_to or pieces * len(rows)  # eager: no padding pieces beyond what empties need
        layout = self._layout(rows, kv_lens, extra=fill_to - len(rows) if pieces > 1 else 0)
        indptr, last, split = layout.indptr_host, layout.last_page_len_host, None
        if pieces > 1:
            indptr, last, split = self._cut_into_pieces(layout, pieces, fill_to, out)
        self._plan_copied.synchronize()
        wrapper.plan(
            indptr,
            layout.indices,
            last,
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dim,
            self.page_size,
            q_data_type=self.dtype,
            kv_data_type=self.dtype,
        )
        self._plan_copied.record()
        return FlashInferMetadata(wrapper, layout.total, split)

    def _triton_decode(self, bs: int) -> bool:
        return bs <= self.small_decode_max_bs or bs >= self.large_decode_min_bs

    def _small_decode(self, rows: List[int], kv_lens: List[int], out: Optional[torch.Tensor] = None) -> SmallDecodeMetadata:
        """Rows, key counts and (longest first) each entry's request for `decode_attention`, in one copy
        (into `out`, a graph's buffer, if given)."""
        bs = len(rows)
        part = -(-bs // 4) * 4  # each of the three parts 16-byte aligned: one compiled kernel for every batch size
        listed = self.large_decode_min_bs <= bs <= self.longest_first_max_bs  # a few requests' programs are all splits of them
        order = sorted(range(bs), key=kv_lens.__getitem__, reverse=True) if listed else list(range(bs))
        pad = [0] * (part - bs)
        host = torch.tensor([rows[i] for i in order] + pad + [kv_lens[i] for i in order] + pad + order + pad, dtype=torch.int32, pin_memory=True)
        dev = host.to(self.device, non_blocking=True) if out is None else out[: 3 * part].copy_(host, non_blocking=True)
        entries = dict(rows=dev[:bs], kv_lens=dev[part : part + bs], order=dev[2 * part : 2 * part + bs] if listed else None)
        if bs >= self.large_decode_min_bs:
            return SmallDecodeMetadata(**entries, splits=large_decode_splits(bs, self.num_kv_heads, self._sms), large=True)
        return SmallDecodeMetadata(**entries, splits=decode_splits(bs, self.num_kv_heads, self._sms))

    def prepare_metadata(self, batch: "Batch") -> None:
        reqs = batch.reqs
        rows = [r.table_idx for r in reqs]
        kv_lens = [r.device_len for r in reqs]
        if batch.is_decode:
            if self._triton_decode(len(rows)):
                batch.attn_metadata = self._small_decode(rows, kv_lens)
            else:
                batch.attn_metadata = self._plan_decode(self.decode_wrapper, rows, kv_lens)
            return
        layout = self._layout(rows, kv_lens)
        qo_indptr = torch.tensor([0, *itertools.accumulate(r.extend_len for r in reqs)], dtype=torch.int32, pin_memory=True)
        self._plan_copied.synchronize()
        self.prefill_wrapper.plan(
            qo_indptr,
            layout.indptr_host,
            layout.indices,
            layout.last_page_len_host,
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dim,
            self.page_size,
            causal=True,  # query i of a request sees keys up to kv_len - extend_len + i
            q_data_type=self.dtype,
            kv_data_type=self.dtype,
        )
        self._plan_copied.record()
        batch.attn_metadata = FlashInferMetadata(self.prefill_wrapper, layout.total)

    # ---- the forward pass --------------------------------------------------------------------
    def kv_destination(self, layer_id: int) -> Tuple[torch.Tensor, torch.Tensor]:
        return self._flat[layer_id]  # the RoPE kernel writes k and v here: one launch per layer fewer

    def forward(self, q: torch.Tensor, k: Optional[torch.Tensor], v: Optional[torch.Tensor], layer_id: int, batch: "Batch") -> torch.Tensor:
        k_flat, v_flat = self._flat[layer_id]
        if k is not None:
            store_kv(k, v, k_flat, v_flat, batch.out_loc)
        meta = batch.attn_metadata
        if isinstance(meta, SmallDecodeMetadata):
            return self._triton_attend(q, layer_id, meta)
        if meta.pieces is None:
            return meta.wrapper.run(q.contiguous(), self._paged[layer_id])
        # a query row per piece, then one merge: each request's pieces are consecutive rows
        parts, lse = meta.wrapper.run(q.index_select(0, meta.pieces.owner), self._paged[layer_id], return_lse=True)
        return merge_pieces(parts, lse, meta.pieces.part_start)

    def forward_rotating(self, q: torch.Tensor, rope: PendingRope, layer_id: int, batch: "Batch") -> Optional[torch.Tensor]:
        meta = batch.attn_metadata
        if not isinstance(meta, SmallDecodeMetadata) or meta.rows.numel() > ROPE_IN_DECODE_MAX_BS:
            return None
        return self._triton_attend(q, layer_id, meta, rope)

    def _triton_attend(self, q: torch.Tensor, layer_id: int, meta: SmallDecodeMetadata, rope: Optional[PendingRope] = None) -> torch.Tensor:
        k_flat, v_flat = self._flat[layer_id]
        tile = dict(block=LARGE_BATCH_BLOCK, stages=LARGE_BATCH_STAGES) if meta.large else {}
        return decode_attention(q, k_flat, v_flat, self.page_table, meta.rows, meta.kv_lens, self._small_scratch, meta.splits, rope=rope,
                                order=meta.order, **tile)

    # ---- CUDA graphs -------------------------------------------------------------------------
    def supports_cuda_graph(self) -> bool:
        return True

    def init_capture_graph(self, max_bs: int, bs_list: List[int]) -> None:
        """Fixed buffers shared by one decode wrapper per captured batch size."""
        most = max_bs * max(self._pieces_for(bs) for bs in bs_list)  # requests or pieces FlashInfer sees
        self._cg_indptr = torch.zeros(most + 1, dtype=torch.int32, device=self.device)
        self._cg_last_page_len = torch.ones(most, dtype=torch.int32, device=self.device)
        # every real page at most once, plus one dummy page per padding request or padding piece
        self._cg_indices = torch.zeros(self.kv_cache.num_pages + most, dtype=torch.int32, device=self.device)
        self._cg_pieces = torch.zeros(most + max_bs + 1, dtype=torch.int32, device=self.device)  # owners, then part_start
        self._graph_wrappers = {bs: self._make_decode_wrapper(bs) for bs in bs_list if not self._triton_decode(bs)}
        self._cg_small = torch.zeros(3 * -(-max_bs // 4) * 4, dtype=torch.int32, device=self.device)  # rows, key counts, requests

    def _padded_rows(self, batch: "Batch") -> Tuple[List[int], List[int]]:
        pad = batch.padded_size - batch.size
        assert pad >= 0, f"padded size {batch.padded_size} below batch size {batch.size}"
        rows = [r.table_idx for r in batch.reqs] + [self.dummy_row] * pad
        kv_lens = [r.device_len for r in batch.reqs] + [1] * pad  # a padding request sees its own slot
        return rows, kv_lens

    def prepare_for_capture(self, batch: "Batch") -> None:
        self.prepare_for_replay(batch)

    def prepare_for_replay(self, batch: "Batch") -> None:
        rows, kv_lens = self._padded_rows(batch)
        if self._triton_decode(batch.padded_size):
            batch.attn_metadata = self._small_decode(rows, kv_lens, self._cg_small)
        else:
            bs = batch.padded_size
            batch.attn_metadata = self._plan_decode(self._graph_wrappers[bs], rows, kv_lens, bs * self._pieces_for(bs), self._cg_pieces)


def flashinfer_problem(device: torch.device, dtype: torch.dtype, head_dim: int) -> str | None:
    """Why FlashInfer cannot run this KV cache, or None if it can: the rule the registry's "auto"
    applies before choosing this backend, and the backend applies when it is built."""
    if device.type != "cuda":
        return "it needs the model on a CUDA device"
    if dtype not in FLASHINFER_DTYPES:
        return f"it runs in float16 or bfloat16, not {dtype}"
    if head_dim not in FLASHINFER_HEAD_DIMS:
        return f"it supports head_dim {', '.join(map(str, FLASHINFER_HEAD_DIMS))}, and this model's is {head_dim}"
    return None
