"""Wrong: passes over a request that does not fit and admits the ones after it, so a large request can wait for ever."""

from collections import deque
from typing import List, Optional, Sequence

from minisgl.core import Batch, Req
from minisgl.scheduler.cache import CacheManager
from minisgl.scheduler.prefill import PendingReq, PrefillAdder
from minisgl.scheduler.prefill import PrefillManager as EnginePrefillManager


def longest_prefix_first(waiting: Sequence[PendingReq], cache: CacheManager) -> List[PendingReq]:
    hits = [cache.match(p.input_ids).handle.cached_len for p in waiting]  # what admission would reuse
    order = sorted(range(len(waiting)), key=lambda i: -hits[i])  # stable: equal hits keep arrival order
    return [waiting[i] for i in order]


class PrefillManager(EnginePrefillManager):
    def admission_order(self) -> List[PendingReq]:
        if self.schedule_policy == "lpm" and len(self.pending) > 1:
            return longest_prefix_first(self.pending, self.cache)
        return list(self.pending)

    def schedule_next_batch(self, reserved_pages: int) -> Optional[Batch]:
        adder = PrefillAdder(self.max_extend_tokens, reserved_pages, self.table, self.cache)
        reqs: List[Req] = []
        if self.chunked is not None:  # a half-done prompt already holds a row and pages
            reqs.append(adder.continue_chunk(self.chunked))
            self.chunked = None
        admitted = set()
        for pending in self.admission_order():
            req = adder.try_admit(pending)
            if req is None:
                continue
            admitted.add(pending.uid)
            reqs.append(req)
        if admitted:
            self.pending = deque(p for p in self.pending if p.uid not in admitted)  # arrival order kept
        if not reqs:
            return None
        if reqs[-1].is_chunk:
            self.chunked = reqs[-1]
        return Batch(reqs=reqs, phase="prefill")
