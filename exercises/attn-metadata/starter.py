"""Exercise attn-metadata (chapter 5): what the torch attention backend precomputes per batch.

Write `TorchAttnBackend.prepare_metadata`. The metadata class, `attend` and the KV pool are the
engine's. Grade with `python judge.py attn-metadata`.
"""

import torch

from minisgl.attention.torch_backend import TorchAttnBackend as EngineTorchAttnBackend
from minisgl.attention.torch_backend import TorchAttnMetadata
from minisgl.core import Batch


class TorchAttnBackend(EngineTorchAttnBackend):
    def prepare_metadata(self, batch: Batch) -> None:
        """Set `batch.attn_metadata` to a `TorchAttnMetadata` (q_starts, cached_lens, kv_lens,
        kv_slots, kv_mask) built from `batch.reqs` and `self.page_table`."""
        raise NotImplementedError("attn-metadata: write TorchAttnBackend.prepare_metadata")
