"""Exercise prefill-adder (chapter 7): admission control for one prefill batch.

Write `PrefillAdder.admit`, the decision whether a waiting request joins this step's prefill
batch. The engine calls it from `try_admit`, which handles the prefix cache around it (chapters
8 and 9). Grade with `python judge.py prefill-adder`.
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

        It fits when a table row is free, some token budget is left, and the KV pool can hold the
        request to its end on top of the pages promised to requests admitted before
        (`self.reserved_pages`). An admitted request has its row, its prompt in the token pool,
        and computes as much of the rest of its prompt as the budget allows; the adder's budget
        and promises account for it.
        """
        raise NotImplementedError("prefill-adder: write PrefillAdder.admit")
