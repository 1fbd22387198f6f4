"""Exercise cache-aware (chapter 22, the capstone): longest-prefix-match scheduling.

Write three pieces: the policy `longest_prefix_first`, and in `PrefillManager` the method that
picks the order (`admission_order`) and the admission loop that walks it (`admit_in_order`).
`PrefillAdder` (try_admit), the prefill schedules that call your two methods (chapter 7's and
chapter 10's), the cache manager and the radix cache are the engine's.
Grade with `python judge.py cache-aware`.
"""

from collections import deque  # noqa: F401  (you will likely want it)
from typing import List, Sequence

from minisgl.core import Req
from minisgl.scheduler.cache import CacheManager
from minisgl.scheduler.prefill import MAX_PASSED_OVER, PendingReq, PrefillAdder  # noqa: F401
from minisgl.scheduler.prefill import PrefillManager as EnginePrefillManager


def longest_prefix_first(waiting: Sequence[PendingReq], cache: CacheManager) -> List[PendingReq]:
    """A new list of the waiting requests, longest cached prefix first, as `cache.match` measures
    it (the prefix admission would reuse); equal prefixes keep their order in `waiting`.

    Must not lock anything, and must not change `waiting` or any request in it.
    """
    raise NotImplementedError("cache-aware: write longest_prefix_first")


class PrefillManager(EnginePrefillManager):
    def admission_order(self) -> List[PendingReq]:
        """The waiting requests in the order this step offers them: none when no table row is
        free, `self.pending` as it is for "fcfs", `longest_prefix_first` for "lpm"
        (`self.schedule_policy`)."""
        raise NotImplementedError("cache-aware: write PrefillManager.admission_order")

    def admit_in_order(self, adder: PrefillAdder, order: Sequence[PendingReq], reqs: List[Req]) -> List[Req]:
        """Offer the requests of `order` to `adder.try_admit`, appending each admitted one to
        `reqs` and passing over the refused ones, until a refused one may be longer than the
        budget left (`adder.spent > 0`), was passed over `MAX_PASSED_OVER` times already, or no
        row is left; return `reqs`. A refused request with one admitted behind it was passed over
        once more (`passed_over`). Admitted requests leave `self.pending`; the others stay in
        arrival order."""
        raise NotImplementedError("cache-aware: write PrefillManager.admit_in_order")
