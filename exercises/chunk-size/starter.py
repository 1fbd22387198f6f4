"""Exercise chunk-size (chapter 10): chunked prefill.

Write `ChunkedPrefillAdder.continue_chunk` and `ChunkedPrefillManager.schedule_next_batch`.
Admission of a new request (`try_admit`, with the chunked adder's `tokens_to_compute`), the
admission loop (`admit_in_order`) and `newcomer_share` are the engine's.
Grade with `python judge.py chunk-size`.
"""

from typing import List, Optional

from minisgl.core import Batch, Req
from minisgl.scheduler.chunked import ChunkedPrefillAdder as EngineChunkedPrefillAdder
from minisgl.scheduler.chunked import ChunkedPrefillManager as EngineChunkedPrefillManager
from minisgl.scheduler.prefill import PendingReq  # noqa: F401


class ChunkedPrefillAdder(EngineChunkedPrefillAdder):
    def continue_chunk(self, req: Req, leave: int = 0) -> Req:
        """Size the next chunk of a half-prefilled request from the token budget, keeping `leave`
        tokens of it for waiting requests; spend it (`token_budget` and `spent`)."""
        raise NotImplementedError("chunk-size: write ChunkedPrefillAdder.continue_chunk")


class ChunkedPrefillManager(EngineChunkedPrefillManager):
    def schedule_next_batch(self, reserved_pages: int) -> Optional[Batch]:
        """The next prefill batch: the half-done request first (leaving `newcomer_share` of the
        budget), then waiting requests through `admit_in_order` (only whole ones beside a chunk).
        Remember the request left half done. None if the batch is empty."""
        raise NotImplementedError("chunk-size: write ChunkedPrefillManager.schedule_next_batch")
