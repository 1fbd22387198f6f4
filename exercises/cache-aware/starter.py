"""Exercise cache-aware (chapter 22, the capstone): longest prefix match with a bounded wait.

Write `AgedLongestPrefix.order`, the order in which the policy `schedule_policy="lpm-aged"` offers
the waiting requests to admission each step. The policy's state (`self.max_wait`, `self.waited`),
lpm's order (`self.lpm.order`), admission and the radix cache are the engine's.
Grade with `python judge.py cache-aware`.
"""

from typing import List, Sequence

from minisgl.scheduler.aging import AgedLongestPrefix as EngineAgedLongestPrefix
from minisgl.scheduler.cache import CacheManager
from minisgl.scheduler.prefill import PendingReq


class AgedLongestPrefix(EngineAgedLongestPrefix):
    def order(self, waiting: Sequence[PendingReq], cache: CacheManager) -> List[PendingReq]:
        """A new list of the requests of `waiting` (given in arrival order): first the overdue
        ones, those passed over `self.max_wait` admission steps or more, in arrival order; then
        the others in lpm's order (`self.lpm.order(others, cache)`, called once, on them only).

        `self.waited` maps a uid to the admission steps that request has been passed over; a uid
        it does not hold has been passed over none. Each call is one admission step: afterwards
        `self.waited` holds exactly the uids of `waiting`, each counted one step more (a request
        admitted this step is never offered again, so its count goes when the next call drops it).

        Must not lock anything, and must not change `waiting` or any request in it.
        """
        raise NotImplementedError("cache-aware: write AgedLongestPrefix.order")
