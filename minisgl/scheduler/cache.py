"""`CacheManager`: the page allocator with a prefix cache. It lends computed prompts' pages to the
cache, reuses the prefixes the cache holds, and evicts from it when the free list runs short."""

from __future__ import annotations

from typing import Iterable

import torch

from minisgl.core import BaseCacheHandle, Req
from minisgl.kvcache.base import BasePrefixCache, MatchResult
from minisgl.utils import align_down

from .pages import PageAllocator


class CacheManager(PageAllocator):
    def __init__(self, num_pages: int, page_size: int, prefix_cache: BasePrefixCache, page_table: torch.Tensor):
        super().__init__(num_pages, page_size, page_table)
        self.prefix_cache = prefix_cache

    # ---- sizes ---------------------------------------------------------------------------
    @property
    def available_pages(self) -> int:
        """Pages that can be handed out now: free, or held by the cache and evictable."""
        return self.free_pages + self.prefix_cache.evictable_size // self.page_size

    def own_start(self, req: Req) -> int:
        """The pages of the prefix `req` matched are the cache's; `req` owns those after it."""
        return req.cache_handle.cached_len

    def kept_pages(self) -> torch.Tensor:
        """The pages the prefix cache holds."""
        return self._pages_of(self.prefix_cache.all_indices())

    # ---- prefix reuse --------------------------------------------------------------------
    def match(self, input_ids: torch.Tensor) -> MatchResult:
        """Longest cached prefix, leaving at least one prompt token to compute (for its logits)."""
        return self.prefix_cache.match_prefix(input_ids[: len(input_ids) - 1])

    def lock(self, req_handle: BaseCacheHandle, unlock: bool = False) -> None:
        self.prefix_cache.lock_handle(req_handle, unlock=unlock)

    # ---- allocation ----------------------------------------------------------------------
    def reclaim(self, n: int) -> None:
        """Evict unlocked prefixes from the cache to free `n` pages (or as many as it can)."""
        self._release_slots(self.prefix_cache.evict(n * self.page_size))

    def cache_prompt(self, req: Req) -> None:
        """Offer the prompt computed so far to the cache while `req` still runs (called when a
        prefill step is launched), so a request admitted from the next step on reuses it instead
        of computing it again. The cache takes the whole pages it lacked; where it already held
        some (another request computed the same tokens), `req` switches to the cache's copy and
        frees its own. `req` then locks the longer prefix and owns only the pages after it."""
        ps = self.page_size
        start = req.cache_handle.cached_len
        insert_len = align_down(min(req.cached_len, req.prompt_len), ps)
        if insert_len <= start:
            return
        ids = req.input_ids[:insert_len]
        row = self.page_table[req.table_idx]
        had = self.prefix_cache.insert_prefix(ids, row[:insert_len])
        handle, indices = self.prefix_cache.match_prefix(ids)
        held = handle.cached_len  # what the cache holds of the prompt now (a cache may keep nothing)
        if held <= start:
            return
        dup_end = min(had, held)
        if dup_end > start:  # another request's copy of [start, dup_end) is the cache's: use it
            self._release_slots(row[start:dup_end].clone())
            row[start:dup_end] = indices[start:dup_end].to(row.dtype)
        self.lock(handle)
        self.lock(req.cache_handle, unlock=True)
        req.cache_handle = handle

    def release(self, req: Req) -> None:
        """Give back everything `req` holds: offer its computed prefix to the cache, free the rest,
        and drop its lock on the prefix it matched. Called exactly once per request."""
        ps = self.page_size
        owned_end = self.owned_pages(req, ps) * ps
        valid = min(req.cached_len, len(req.input_ids))  # positions whose KV and token are known
        insert_len = align_down(valid, ps)
        slots = self.page_table[req.table_idx, :owned_end]
        start = req.cache_handle.cached_len
        kept_until = start
        if insert_len > 0:
            kept_until = max(self.prefix_cache.insert_prefix(req.input_ids[:insert_len], slots[:insert_len]), start)
        self._release_slots(slots[start:kept_until])  # duplicates of what the cache already had
        self._release_slots(slots[insert_len:])  # beyond whole pages: not cacheable
        self.lock(req.cache_handle, unlock=True)

    # ---- checks --------------------------------------------------------------------------
    def check_integrity(self, live: Iterable[Req]) -> None:
        """The cache's own bookkeeping holds, and every page is free, the cache's, or a live
        request's."""
        self.prefix_cache.check_integrity()
        super().check_integrity(live)
