"""A complete answer to attn-metadata (the engine's own logic)."""

import torch

from minisgl.attention.torch_backend import TorchAttnBackend as EngineTorchAttnBackend
from minisgl.attention.torch_backend import TorchAttnMetadata
from minisgl.core import Batch


class TorchAttnBackend(EngineTorchAttnBackend):
    def prepare_metadata(self, batch: Batch) -> None:
        dev = self.page_table.device
        rows = torch.tensor([r.table_idx for r in batch.reqs], device=dev)
        kv_lens = [r.device_len for r in batch.reqs]  # keys: everything up to and including the new tokens
        max_len = max(kv_lens)
        lens = torch.tensor(kv_lens, device=dev)
        mask = torch.arange(max_len, device=dev)[None, :] < lens[:, None]  # [bs, max_len]
        slots = self.page_table[rows, :max_len].masked_fill(~mask, 0).long()
        q_starts, start = [], 0
        for r in batch.reqs:
            q_starts.append(start)
            start += r.extend_len
        batch.attn_metadata = TorchAttnMetadata(q_starts, [r.cached_len for r in batch.reqs], kv_lens, slots, mask)
