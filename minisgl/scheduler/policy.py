"""Scheduling policies: the order in which waiting requests are offered to admission.

`fcfs` offers them in arrival order. `lpm` (longest prefix match) offers first the requests whose
prompt the prefix cache already holds the most of: they cost the least to prefill, and while they
run they keep their prefix locked, so the requests that share it find it still cached instead of
evicted by unrelated prompts. Ties keep arrival order. Admission still stops at the first request
that does not fit, in whichever order the policy gives.

`lpm` never starves a request for long in a closed workload, but a steady stream of hits can keep
a request with no hit waiting; production engines bound that with a fallback to arrival order
(SGLang uses FCFS when the waiting queue is long) or by ageing a request's priority.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Sequence

if TYPE_CHECKING:
    from .cache import CacheManager
    from .prefill import PendingReq

SCHEDULE_POLICIES = ("fcfs", "lpm")


def longest_prefix_first(waiting: Sequence["PendingReq"], cache: "CacheManager") -> List["PendingReq"]:
    """The waiting requests, longest cached prefix first (as `cache.match` measures what admission
    would reuse); equal prefixes keep their order in `waiting`. Locks nothing and leaves `waiting`
    as it is; matching may split a radix node, which changes no cached content."""
    hits = [cache.match(p.input_ids).handle.cached_len for p in waiting]
    order = sorted(range(len(waiting)), key=lambda i: -hits[i])  # sorted() is stable: ties by arrival
    return [waiting[i] for i in order]
