"""Exercise prefill-adder (chapter 7): admission control for one prefill batch.

Write `PrefillAdder.try_admit`. The rest of the adder (its fields, `continue_chunk`) and every
manager it talks to are the engine's. Grade with `python judge.py prefill-adder`.
"""

from typing import Optional

import torch

from minisgl.core import Req
from minisgl.scheduler.prefill import PendingReq
from minisgl.scheduler.prefill import PrefillAdder as EnginePrefillAdder
from minisgl.utils import div_ceil


class PrefillAdder(EnginePrefillAdder):
    def try_admit(self, pending: PendingReq) -> Optional[Req]:
        """Admit `pending` into this batch, or return None (and change nothing) if it does not fit.

        Fits means: a table row is free, some token budget is left, no prompt already in the batch
        computes what this one could reuse next step (`self.computes_prefix_of`), and the KV pool
        can hold the request to its end on top of `self.reserved_pages`. On success: a `Req` with
        its matched prefix locked, its row filled, its first chunk sized by the budget; budget and
        reservation updated, the prompt noted (`self.note_admitted`).
        """
        raise NotImplementedError("prefill-adder: write PrefillAdder.try_admit")
