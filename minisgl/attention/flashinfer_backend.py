"""Attention through FlashInfer's paged kernels (CUDA only).

FlashInfer reads the KV pool in place, through a CSR list of pages per request:
`kv_indptr[i] : kv_indptr[i + 1]` delimits request i's entries in `kv_indices`, each entry a
page number (a slot of the page's first position divided by the page size), and
`kv_last_page_len[i]` says how many positions of its last page are filled. Prefill (and the
extend of a cached prefix or a prompt chunk) uses the causal mask aligned to the end of each
request's keys; decode has one query per request.

A wrapper is *planned* once per batch on the host (FlashInfer decides how to split the work)
and then *run* once per layer.
"""

from __future__ import annotations

import importlib.util
import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, List, Optional, Tuple

import torch

from minisgl.kernel import gather_page_indices
from minisgl.kvcache.mha_pool import MHAKVCache

from .base import BaseAttnBackend, BaseAttnMetadata
from .registry import attention_backend

if TYPE_CHECKING:
    from minisgl.core import Batch

FLASHINFER_HEAD_DIMS, FLASHINFER_DTYPES = (64, 128, 256), (torch.float16,
                                                           torch.bfloat16)  # what its kernels are built for
_WORKSPACE_BYTES = 256 << 20  # FlashInfer's scratch for split-KV partial results


@dataclass
class FlashInferMetadata(BaseAttnMetadata):
    wrapper: object  # a planned BatchPrefill/BatchDecode wrapper
    num_pages: int  # pages referenced by the batch (for inspection and tests)


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


def flashinfer_problem(device: torch.device, dtype: torch.dtype, head_dim: int) -> Optional[str]:
    """Why FlashInfer cannot run this KV cache, or None if it can: the rule the registry's "auto"
    applies before choosing this backend, and the backend applies when it is built."""
    if device.type != "cuda":
        return "it needs the model on a CUDA device"
    if dtype not in FLASHINFER_DTYPES:
        return f"it runs in float16 or bfloat16, not {dtype}"
    if head_dim not in FLASHINFER_HEAD_DIMS:
        return f"it supports head_dim {', '.join(map(str, FLASHINFER_HEAD_DIMS))}, and this model's is {head_dim}"
    return None


def flashinfer_missing_or_problem(device: torch.device, dtype: torch.dtype, head_dim: int) -> Optional[str]:
    """`flashinfer_problem`, and first whether FlashInfer is installed at all: what "auto" checks."""
    if importlib.util.find_spec("flashinfer") is None:
        return "FlashInfer is not installed"
    return flashinfer_problem(device, dtype, head_dim)


@attention_backend("flashinfer", priority=1, problem=flashinfer_missing_or_problem)
class FlashInferAttnBackend(BaseAttnBackend):
    def __init__(self, kv_cache: MHAKVCache, page_table: torch.Tensor, num_qo_heads: int, pad_slot: int = 0):
        import flashinfer

        problem = flashinfer_problem(page_table.device, kv_cache.buffer.dtype, kv_cache.head_dim)
        if problem is not None:  # the same rule "auto" applies before choosing this backend
            raise ValueError(f"the FlashInfer backend cannot run here: {problem}; use attention_backend='auto' or "
                             "'torch'")
        self.kv_cache = kv_cache
        self.page_table = page_table  # [rows + 1 dummy, max_seq_len] slot of each position
        self.device = page_table.device
        self.page_size = kv_cache.page_size
        self.num_qo_heads = num_qo_heads
        self.num_kv_heads = kv_cache.num_kv_heads
        self.head_dim = kv_cache.head_dim
        self.dtype = kv_cache.buffer.dtype
        self.pad_slot = pad_slot
        ps, h, d = self.page_size, self.num_kv_heads, self.head_dim
        # per layer: the flat [slots, heads, dim] views we write to, the paged views FlashInfer reads
        self._flat = [(kv_cache.k_cache(i), kv_cache.v_cache(i)) for i in range(kv_cache.num_layers)]
        self._paged = [(k.view(-1, ps, h, d), v.view(-1, ps, h, d)) for k, v in self._flat]
        self.workspace = torch.empty(_WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        self.prefill_wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD", backend="fa2")
        self.decode_wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(self.workspace, "NHD")
        # plan() stages its schedule in a pinned host buffer and copies it asynchronously; the
        # next plan must not overwrite that buffer before the copy has run on the GPU
        self._plan_copied = torch.cuda.Event()

    # ---- planning ----------------------------------------------------------------------------
    def _layout(self, rows: List[int], kv_lens: List[int]) -> PageLayout:
        """The batch's page list, gathered from the page table on the device."""
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
        indices = torch.empty(total, dtype=torch.int32, device=self.device)
        gather_page_indices(self.page_table, dev[2 * bs + 1 + gap :], dev[: bs + 1], ps, total, max_pages, out=indices)
        return PageLayout(host[: bs + 1], host[bs + 1 : 2 * bs + 1], indices, total)

    def plan_decode(self, wrapper, rows: List[int], kv_lens: List[int]) -> FlashInferMetadata:
        """Plan a decode `wrapper` for the requests on page-table `rows`, with `kv_lens` keys each."""
        layout = self._layout(rows, kv_lens)
        self._plan_copied.synchronize()
        wrapper.plan(
            layout.indptr_host,
            layout.indices,
            layout.last_page_len_host,
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dim,
            self.page_size,
            q_data_type=self.dtype,
            kv_data_type=self.dtype,
        )
        self._plan_copied.record()
        return FlashInferMetadata(wrapper, layout.total)

    def _plan_prefill(self, batch: "Batch") -> FlashInferMetadata:
        reqs = batch.reqs
        layout = self._layout([r.table_idx for r in reqs], [r.device_len for r in reqs])
        qo_indptr = torch.tensor([0, *itertools.accumulate(r.extend_len for r in reqs)], dtype=torch.int32,
                                 pin_memory=True)
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
        return FlashInferMetadata(self.prefill_wrapper, layout.total)

    def prepare_metadata(self, batch: "Batch") -> None:
        if batch.is_decode:
            rows, kv_lens = [r.table_idx for r in batch.reqs], [r.device_len for r in batch.reqs]
            batch.attn_metadata = self.plan_decode(self.decode_wrapper, rows, kv_lens)
        else:
            batch.attn_metadata = self._plan_prefill(batch)

    # ---- the forward pass --------------------------------------------------------------------
    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: "Batch") -> torch.Tensor:
        self.kv_cache.store_kv(k, v, batch.out_loc, layer_id)
        return batch.attn_metadata.wrapper.run(q.contiguous(), self._paged[layer_id])
