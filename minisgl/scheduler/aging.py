"""Longest prefix match with a bounded wait: lpm's order, except that a request passed over for
`lpm_max_wait` admission steps goes first.

Under plain lpm a request without a cache hit is offered after every request with one, so a steady
stream of hits keeps it waiting for as long as the stream lasts. Here each waiting request counts
the admission steps it has been offered and not admitted; once the count reaches the bound it is
*overdue*, and the overdue are offered before everyone else, in arrival order. A request that
falls due is then overtaken only by requests that arrived before it. The bound is the setting this
module adds to `SchedulerConfig`, `lpm_max_wait`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

from minisgl.utils.settings import extends_config

from .cache import CacheManager
from .config import SchedulerConfig
from .prefill import SCHEDULE_POLICIES, PendingReq, SchedulePolicy, register_schedule_policy
from .prefix import LongestPrefixMatch

# 8 admission steps: a group sharing a cached prefix is admitted over a few batches before the
# bound can break it up (and let its prefix be evicted); a request with no hit is passed over at
# most 8 times, where under plain lpm it waits for as long as hits keep arriving.
LPM_MAX_WAIT = 8


@register_schedule_policy("lpm-aged")
class AgedLongestPrefix(SchedulePolicy):
    """lpm, with the overdue first (in arrival order). `waited` maps the uid of every request seen
    waiting at the last step to the admission steps it has been passed over."""

    summary = f"lpm-aged: lpm, but a request passed over --lpm-max-wait steps goes first (default {LPM_MAX_WAIT})"
    settings = ("lpm_max_wait",)

    def __init__(self, lpm_max_wait: int = LPM_MAX_WAIT):
        assert lpm_max_wait >= 0, "SchedulerConfig checks lpm_max_wait"
        self.max_wait = lpm_max_wait
        self.waited: Dict[int, int] = {}
        self.lpm = LongestPrefixMatch()

    @classmethod
    def check_config(cls, config: SchedulerConfig) -> None:
        LongestPrefixMatch.check_config(config)  # lpm's order: it needs what lpm needs

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


@extends_config(SchedulerConfig)
@dataclass(frozen=True)
class AgingSettings:
    """`SchedulerConfig`'s setting for `lpm-aged`."""

    lpm_max_wait: Optional[int] = field(default=None, metadata={
        "help": "admission steps a waiting request may be passed over before it goes first, in arrival order, "
                "under a policy that bounds waiting (see --schedule-policy); default: the policy's own"})

    def __post_init__(self) -> None:
        super().__post_init__()
        wait = self.lpm_max_wait
        if wait is not None and (not isinstance(wait, int) or isinstance(wait, bool) or wait < 0):
            raise ValueError(f"lpm_max_wait must be a whole number of admission steps, 0 or more (0 offers every "
                             f"request in arrival order), or None for the policy's default; got {wait!r}")
        readers = [name for name, policy in SCHEDULE_POLICIES.items() if "lpm_max_wait" in policy.settings]
        if wait is not None and self.schedule_policy not in readers:
            raise ValueError(f"lpm_max_wait is read only by schedule_policy {' or '.join(readers) or '(none here)'}; "
                             f"{self.schedule_policy!r} would ignore it: leave it unset or choose such a policy")
