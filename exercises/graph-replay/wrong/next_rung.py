"""Wrong: `bisect_right` skips a captured size equal to the batch size (a batch of 4 replays the
graph for 8), and a batch of the largest size finds no graph at all."""

import bisect

import torch

from minisgl.core import Batch
from minisgl.engine.graph import GraphRunner as EngineGraphRunner


class GraphRunner(EngineGraphRunner):
    def padded_size(self, bs: int) -> int:
        return self.bs_list[min(bisect.bisect_right(self.bs_list, bs), len(self.bs_list) - 1)]

    def run(self, batch: Batch) -> torch.Tensor:
        bs = batch.size
        pad = self.padded_size(bs)
        batch.padded_size = pad
        self.input_ids[:bs].copy_(batch.input_ids)
        self.positions[:bs].copy_(batch.positions)
        self.out_loc[:bs].copy_(batch.out_loc)
        if pad > bs:
            # rows past the batch may hold an earlier, larger batch's slots: point them at the dummy page
            self.out_loc[bs:pad].fill_(self.dummy_slot)
            self.positions[bs:pad].zero_()
        self.engine.attn_backend.prepare_for_replay(batch)
        self.graphs[pad].replay()
        return self.logits[pad][:bs]
