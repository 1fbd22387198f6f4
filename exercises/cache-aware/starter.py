"""Exercise cache-aware (chapter 22, the capstone): longest-prefix-match scheduling.

Write three pieces: the policy `longest_prefix_first`, and in `PrefillManager` the method that
picks the order (`admission_order`) and the prefill schedule that walks it
(`schedule_next_batch`). `PrefillAdder` (try_admit, continue_chunk), the cache manager and the
radix cache are the engine's. Grade with `python judge.py cache-aware`.
"""

from collections import deque  # noqa: F401  (you will likely want it)
from typing import List, Optional, Sequence

from minisgl.core import Batch, Req  # noqa: F401
from minisgl.scheduler.cache import CacheManager
from minisgl.scheduler.prefill import PendingReq, PrefillAdder  # noqa: F401
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

    def schedule_next_batch(self, reserved_pages: int) -> Optional[Batch]:
        """One prefill batch, or None. A half-done prompt (`self.chunked`) continues first,
        leaving `newcomer_share` of the budget; then requests are offered in `admission_order()`
        (whole only beside a chunk) and admission stops at the first refusal. Admitted requests
        leave `self.pending`; the others stay in arrival order. The request still cut, if any, is
        remembered in `self.chunked`."""
        raise NotImplementedError("cache-aware: write PrefillManager.schedule_next_batch")
