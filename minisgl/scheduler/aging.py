"""Longest prefix match with a bounded wait: lpm's order, except that a request passed over for
`lpm_max_wait` admission steps goes first.

Under plain lpm a request without a cache hit is offered after every request with one, so a steady
stream of hits keeps it waiting for as long as the stream lasts. Here each waiting request counts
the admission steps it has been offered and not admitted; once the count reaches the bound it is
*overdue*, and the overdue are offered before everyone else, in arrival order. A request that
falls due is then overtaken only by requests that arrived before it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Sequence

from .cache import CacheManager
from .prefill import PendingReq, SchedulePolicy, register_schedule_policy
from .prefix import LongestPrefixMatch

if TYPE_CHECKING:  # config lists the registered policies, so this module is imported before it
    from .config import SchedulerConfig

# 8 admission steps: a group sharing a cached prefix is admitted over a few batches before the
# bound can break it up (and let its prefix be evicted); a request with no hit is passed over at
# most 8 times, where under plain lpm it waits for as long as hits keep arriving.
LPM_MAX_WAIT = 8


@register_schedule_policy("lpm-aged")
class AgedLongestPrefix(SchedulePolicy):
    """lpm, with the overdue first (in arrival order). `waited` maps the uid of every request seen
    waiting at the last step to the admission steps it has been passed over."""

    summary = f"lpm-aged: lpm, but a request passed over --lpm-max-wait steps goes first (default {LPM_MAX_WAIT})"
    orders_by_prefix = True
    settings = ("lpm_max_wait",)

    def __init__(self, lpm_max_wait: int = LPM_MAX_WAIT):
        assert lpm_max_wait >= 0, "SchedulerConfig checks lpm_max_wait"
        self.max_wait = lpm_max_wait
        self.waited: Dict[int, int] = {}
        self.lpm = LongestPrefixMatch()

    @classmethod
    def from_config(cls, config: SchedulerConfig) -> AgedLongestPrefix:
        return cls() if config.lpm_max_wait is None else cls(config.lpm_max_wait)

    def order(self, waiting: Sequence[PendingReq], cache: CacheManager) -> List[PendingReq]:
        """The overdue requests of `waiting` (passed over `max_wait` steps or more) in arrival order,
        then the others in lpm's order. Counts this step as one more passed over for every request
        of `waiting` (those admitted will not be seen again), and forgets requests that left."""
        waited = {p.uid: self.waited.get(p.uid, 0) for p in waiting}
        overdue = [p for p in waiting if waited[p.uid] >= self.max_wait]
        fresh = [p for p in waiting if waited[p.uid] < self.max_wait]
        self.waited = {uid: n + 1 for uid, n in waited.items()}
        return overdue + self.lpm.order(fresh, cache)
