"""Exercise chunk-size (chapter 10): chunked prefill.

Write `PrefillAdder.continue_chunk` and `PrefillManager.schedule_next_batch`. Admission of a new
request (`PrefillAdder.try_admit`) is the engine's. Grade with `python judge.py chunk-size`.
"""

from typing import List, Optional

from minisgl.core import Batch, Req
from minisgl.scheduler.prefill import PrefillAdder as EnginePrefillAdder
from minisgl.scheduler.prefill import PrefillManager as EnginePrefillManager


class PrefillAdder(EnginePrefillAdder):
    def continue_chunk(self, req: Req, leave: int = 0) -> Req:
        """Size the next chunk of a half-prefilled request from the token budget, keeping `leave`
        tokens of it for waiting requests; spend it."""
        raise NotImplementedError("chunk-size: write PrefillAdder.continue_chunk")


class PrefillManager(EnginePrefillManager):
    def schedule_next_batch(self, reserved_pages: int) -> Optional[Batch]:
        """The next prefill batch: the half-done request first (leaving `newcomer_share` of the
        budget), then waiting requests in order until one does not fit (only whole ones beside a
        chunk). Remember the request left half done. None if the batch is empty."""
        raise NotImplementedError("chunk-size: write PrefillManager.schedule_next_batch")
