"""Exercise prefill-adder (chapter 7): admission control for one prefill batch.

Write `PrefillAdder.admit`, the decision whether a waiting request joins this step's prefill
batch. The engine calls it from `try_admit`.
Grade with `python judge.py prefill-adder`.
"""

from typing import Optional

from minisgl.core import BaseCacheHandle, Req
from minisgl.scheduler.prefill import PendingReq
from minisgl.scheduler.prefill import PrefillAdder as EnginePrefillAdder
from minisgl.utils import div_ceil


class PrefillAdder(EnginePrefillAdder):
    def admit(self, pending: PendingReq, prefix: BaseCacheHandle) -> Optional[Req]:
        """Admit `pending`, whose first `prefix.cached_len` tokens already have KV, or return None
        and change nothing.

        It fits when a table row is free, the `self.tokens_to_compute(...)` tokens it computes fit
        in what is left of `self.token_budget` (the batch's first prompt, `self.spent == 0`, fits
        whatever its length), and the KV pool can hold the request to its end on top of the pages
        promised before (`self.reserved_pages`). An admitted request has its row and its prompt in
        the token pool; `token_budget`, `spent` and `reserved_pages` account for it.
        """
        raise NotImplementedError("prefill-adder: write PrefillAdder.admit")
