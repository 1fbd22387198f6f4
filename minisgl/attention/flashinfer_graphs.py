"""FlashInfer decode inside CUDA graphs (CUDA only).

Chapter 17's decode wrapper is planned into tensors it allocates for each batch; a graph would
replay the addresses of one batch's page list. Built over fixed buffers (`use_cuda_graph=True`),
a wrapper plans every batch into the same memory, so one wrapper per captured batch size,
sharing those buffers, serves every replay: re-planned before it, for the batch padded to that
size, with the padding requests reading the dummy page.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List

import torch

from .flashinfer_backend import FlashInferAttnBackend
from .graph_support import AttnGraphSupport, dummy_row_of, graph_support, padded_rows

if TYPE_CHECKING:
    from minisgl.core import Batch


@graph_support(FlashInferAttnBackend)
class FlashInferGraphSupport(AttnGraphSupport):
    def __init__(self, backend: FlashInferAttnBackend, max_bs: int, bs_list: List[int]):
        """Fixed buffers shared by one decode wrapper per captured batch size."""
        import flashinfer

        self.backend = backend
        dev = backend.device
        self.indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=dev)
        self.last_page_len = torch.ones(max_bs, dtype=torch.int32, device=dev)
        # every real page at most once, plus one dummy page per padding request
        self.indices = torch.zeros(backend.kv_cache.num_pages + max_bs, dtype=torch.int32, device=dev)
        self.wrappers: Dict[int, object] = {
            bs: flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                backend.workspace,
                "NHD",
                use_cuda_graph=True,
                paged_kv_indptr_buffer=self.indptr[: bs + 1],
                paged_kv_indices_buffer=self.indices,
                paged_kv_last_page_len_buffer=self.last_page_len[:bs],
            )
            for bs in bs_list
        }

    def prepare_for_replay(self, batch: "Batch", size: int) -> None:
        rows, kv_lens = padded_rows(batch, size, dummy_row_of(self.backend.page_table))
        batch.attn_metadata = self.backend.plan_decode(self.wrappers[size], rows, kv_lens)
