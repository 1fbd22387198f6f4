"""Wrong: padding rows keep whatever the buffers held, so after a larger batch they still point at
live requests' slots and the padding requests overwrite real KV."""

import bisect

import torch

from minisgl.core import Batch
from minisgl.engine.graph import GraphRunner as EngineGraphRunner


class GraphRunner(EngineGraphRunner):
    def padded_size(self, bs: int) -> int:
        return self.bs_list[bisect.bisect_left(self.bs_list, bs)]

    def run(self, batch: Batch) -> torch.Tensor:
        bs = batch.size
        pad = self.padded_size(bs)
        batch.padded_size = pad
        self.input_ids[:bs].copy_(batch.input_ids)
        self.positions[:bs].copy_(batch.positions)
        self.out_loc[:bs].copy_(batch.out_loc)
        self.engine.attn_backend.prepare_for_replay(batch)
        self.graphs[pad].replay()
        return self.logits[pad][:bs]
