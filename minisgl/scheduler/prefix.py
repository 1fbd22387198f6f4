"""Prefix reuse: the scheduler with a prefix cache.

The cache manager (`CacheManager`) keeps computed prompts in the prefix cache. This module gives
the scheduler its part: admission starts a request after the longest prefix the cache holds of its
prompt (locked while the request runs), a prompt that would compute again what a prompt of the
same batch computes waits a step (`SHARED_PREFIX_WAIT`), and every launched prefill offers its
prompt to the cache at once (`cache_prompt`). It also registers the `lpm` policy, which offers the
requests with the longest cached prefix first, and adds its setting to `SchedulerConfig`:
`prefix_cache`, the cache by name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from minisgl.core import Batch, Req
from minisgl.kvcache import PREFIX_CACHES, create_prefix_cache
from minisgl.utils import align_up
from minisgl.utils.settings import extends_config

from .cache import CacheManager
from .config import SchedulerConfig
from .prefill import PendingReq, PrefillAdder, PrefillManager, SchedulePolicy, register_schedule_policy
from .scheduler import ForwardResult, extends_scheduler

# A waiting prompt that shares at least this many tokens, past what the cache holds of it, with a
# prompt admitted to the same batch waits for the next step: the scheduler caches every prompt
# when its prefill is launched (`CacheManager.cache_prompt`), so one step later the shared part
# is a cache hit instead of being computed twice. Chat prompts share their template this way.
SHARED_PREFIX_WAIT = 16


def _lead(ids: torch.Tensor) -> bytes:
    return ids[:SHARED_PREFIX_WAIT].numpy().tobytes()


@dataclass
class PrefixAdder(PrefillAdder):
    """A prefill adder that reuses cached prefixes. `prompts` holds the admitted prompts (as far
    as this step computes them), keyed by their first tokens."""

    cache: CacheManager
    prompts: Dict[bytes, List[torch.Tensor]] = field(default_factory=dict)

    def computes_prefix_of(self, ids: torch.Tensor, cached_len: int) -> bool:
        """Whether a prompt admitted to this batch computes at least `SHARED_PREFIX_WAIT` tokens of
        `ids` past `cached_len`, in whole pages (only those can be reused from the cache)."""
        need = align_up(cached_len + SHARED_PREFIX_WAIT, self.cache.page_size)
        if need > len(ids) - 1 or not self.cache.prefix_cache.keeps_prefixes:  # a match leaves the last token
            return False
        return any(len(p) >= need and torch.equal(p[:need], ids[:need]) for p in self.prompts.get(_lead(ids), ()))

    def note_admitted(self, req: Req) -> None:
        if req.device_len >= SHARED_PREFIX_WAIT:
            ids = req.input_ids[: req.device_len]
            self.prompts.setdefault(_lead(ids), []).append(ids)

    def try_admit(self, pending: PendingReq) -> Optional[Req]:
        """Admit `pending` into this batch, or return None and change nothing. Around `admit`
        (the admission decision), the prefix cache's part: reuse the longest cached prefix, locked
        while the request runs, and wait a step for a prefix a prompt of this batch computes."""
        handle, indices = self.cache.match(pending.input_ids)
        if self.computes_prefix_of(pending.input_ids, handle.cached_len):
            return None  # next step the prefix is cached
        self.cache.lock(handle)  # locked, the prefix's pages leave `available_pages`
        req = self.admit(pending, handle)
        if req is None:
            self.cache.lock(handle, unlock=True)
            return None
        if handle.cached_len:
            self.table.page_table[req.table_idx, : handle.cached_len] = indices.to(torch.int32)
        self.note_admitted(req)
        return req


class PrefixPrefillManager(PrefillManager):
    """The waiting queue, admitted by a `PrefixAdder`."""

    cache: CacheManager

    def new_adder(self, reserved_pages: int) -> PrefixAdder:
        return PrefixAdder(self.max_extend_tokens, reserved_pages, self.table, self.cache)


def longest_prefix_first(waiting: Sequence[PendingReq], cache: CacheManager) -> List[PendingReq]:
    """The waiting requests, longest cached prefix first (as `cache.match` measures what admission
    would reuse); equal prefixes keep their order in `waiting`. Locks nothing and leaves `waiting`
    as it is; matching may reorganise the cache's index, which changes no cached content."""
    hits = [cache.match(p.input_ids).handle.cached_len for p in waiting]
    order = sorted(range(len(waiting)), key=lambda i: -hits[i])  # sorted() is stable: ties by arrival
    return [waiting[i] for i in order]


@register_schedule_policy("lpm")
class LongestPrefixMatch(SchedulePolicy):
    """Longest prefix match: first the requests whose prompt the prefix cache holds the most of.
    They cost the least to prefill, and while they run their prefix stays locked, so the requests
    sharing it find it still cached instead of evicted by unrelated prompts. A steady stream of
    hits can keep a request without one waiting for as long as the stream lasts."""

    summary = "lpm: longest cached prefix first (needs a prefix cache that keeps prefixes)"

    @classmethod
    def check_config(cls, config: SchedulerConfig) -> None:
        """With a cache that keeps nothing every prefix hit is empty, and the order is arrival order."""
        if not keeps_prefixes(config.prefix_cache):
            keeping = prefix_keeping_caches()
            what = (f"prefix_cache={' or '.join(map(repr, keeping))}" if keeping else
                    "this package registers none")
            raise ValueError(f"schedule_policy {config.schedule_policy!r} orders requests by their prefix-cache hits "
                             f"and needs a prefix cache that keeps prefixes ({what}); got {config.prefix_cache!r}")

    def order(self, waiting: Sequence[PendingReq], cache: CacheManager) -> List[PendingReq]:
        return longest_prefix_first(waiting, cache) if len(waiting) > 1 else list(waiting)


def prefix_cache_names() -> Tuple[str, ...]:
    """The names `prefix_cache` accepts: the registered caches."""
    return tuple(sorted(PREFIX_CACHES))


def keeps_prefixes(prefix_cache: str) -> bool:
    """Whether the cache registered as `prefix_cache` keeps prefixes (False for a name not registered)."""
    return getattr(PREFIX_CACHES.get(prefix_cache), "keeps_prefixes", False)


def prefix_keeping_caches() -> Tuple[str, ...]:
    """The registered caches that keep prefixes, by name."""
    return tuple(n for n in prefix_cache_names() if keeps_prefixes(n))


def default_prefix_cache() -> str:
    """The first registered cache (by name) that keeps prefixes, else the naive one."""
    return next(iter(prefix_keeping_caches()), "naive")


@extends_config(SchedulerConfig)
@dataclass(frozen=True)
class PrefixCacheSettings:
    """`SchedulerConfig`'s setting for prefix reuse."""

    prefix_cache: str = field(default_factory=default_prefix_cache, metadata={
        "choices": prefix_cache_names(), "aliases": ("cache_type",),
        "help": "the prefix cache by name: one that keeps prefixes reuses shared prompt prefixes (the default, "
                "where one is registered); naive reuses nothing"})

    def __post_init__(self) -> None:
        super().__post_init__()  # the base's checks, the schedule policy's needs among them
        if self.prefix_cache not in prefix_cache_names():
            raise ValueError(f"prefix_cache must be one of {', '.join(prefix_cache_names())}; "
                             f"got {self.prefix_cache!r}")


@extends_scheduler("prefix_cache")
class PrefixCacheMixin:
    """The scheduler with the prefix cache `config.prefix_cache` names. Put in front of
    `Scheduler` in a class's bases."""

    cache: CacheManager

    def make_cache(self) -> CacheManager:
        e = self.engine
        prefix_cache = create_prefix_cache(self.config.prefix_cache, e.page_size, self.device)
        return CacheManager(e.num_pages, e.page_size, prefix_cache, e.page_table)

    def make_prefill_manager(self) -> PrefixPrefillManager:
        c = self.config
        return PrefixPrefillManager(self.table, self.cache, c.max_extend_tokens, c.new_schedule_policy())

    def launch(self, batch: Batch) -> ForwardResult:
        result = super().launch(batch)  # moves each request's ledger on
        if batch.phase == "prefill":  # the next step's admissions may reuse these prompts
            for r in batch.reqs:
                self.cache.cache_prompt(r)
        return result

    def assert_all_free(self) -> None:
        """As `Scheduler`'s (the pages the cache keeps are not free), and no prefix is locked."""
        super().assert_all_free()
        assert self.cache.prefix_cache.protected_size == 0, "a finished request still locks a prefix"
