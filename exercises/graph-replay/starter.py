"""Exercise graph-replay (chapter 18): replay a decode step from a captured graph.

Write `GraphRunner.padded_size` and `GraphRunner.run`. Capture (`_capture_all`), the batch-size
ladder (`self.bs_list`) and the static buffers are the engine's. The judge captures emulated
graphs (see chapters/stage4.py), so it runs anywhere: same buffers, same contract.
Grade with `python judge.py graph-replay`.
"""

import torch

from minisgl.core import Batch
from minisgl.engine.graph import GraphRunner as EngineGraphRunner


class GraphRunner(EngineGraphRunner):
    def padded_size(self, bs: int) -> int:
        """The smallest captured batch size (in the sorted list `self.bs_list`) that holds `bs`."""
        raise NotImplementedError("graph-replay: write GraphRunner.padded_size")

    def run(self, batch: Batch) -> torch.Tensor:
        """Replay the graph for `batch` and return its logits, `[batch.size, vocab]`.

        The graphs read `self.input_ids`, `self.positions` and `self.out_loc` (prefixes as long as
        the captured size) and write `self.logits[size]`; `self.graphs[size].replay()` runs one.
        Make sure padding rows write only to `self.dummy_slot` (at position 0). The attention
        backend's graph support (built before capture, it owns the fixed buffers the graphs'
        attention reads) must plan the batch, padded to the size you replay, before the replay:
        `self.attn_support.prepare_for_replay(batch, size)`.
        """
        raise NotImplementedError("graph-replay: write GraphRunner.run")
