"""`CacheManager`: the one owner of KV pages. Allocates them, reuses prefixes through the prefix
cache, and takes a finished request's pages back (into the cache or the free list)."""

from __future__ import annotations

from typing import Iterable, List, Tuple

import torch

from minisgl.core import Req
from minisgl.kvcache.base import BasePrefixCache, MatchResult
from minisgl.utils import align_down, div_ceil

from .table import TableManager


class CacheManager:
    def __init__(self, num_pages: int, page_size: int, prefix_cache: BasePrefixCache, page_table: torch.Tensor):
        self.num_pages = num_pages
        self.page_size = page_size
        self.prefix_cache = prefix_cache
        self.page_table = page_table
        self._free_pages = torch.arange(num_pages, dtype=torch.int64)  # CPU
        # pages freed from slots on the GPU, on their way to the host: (pinned page ids, copy done)
        self._in_flight: List[Tuple[torch.Tensor, torch.cuda.Event]] = []
        self._in_flight_pages = 0

    # ---- sizes ---------------------------------------------------------------------------
    @property
    def free_pages(self) -> int:
        """Free pages, counting those freed on the GPU whose ids are still being copied back."""
        return len(self._free_pages) + self._in_flight_pages

    @property
    def available_pages(self) -> int:
        """Pages that can be handed out now: free, or held by the cache and evictable."""
        return self.free_pages + self.prefix_cache.evictable_size // self.page_size

    @staticmethod
    def owned_pages(req: Req, page_size: int) -> int:
        """Pages holding this request's KV: [0, cached_len) rounded up to whole pages."""
        return div_ceil(req.cached_len, page_size)

    def pages_to_finish(self, req: Req) -> int:
        """Pages `req` may still need: KV is written for positions below max_device_len - 1."""
        return max(div_ceil(req.max_device_len - 1, self.page_size) - self.owned_pages(req, self.page_size), 0)

    # ---- prefix reuse --------------------------------------------------------------------
    def match(self, input_ids: torch.Tensor) -> MatchResult:
        """Longest cached prefix, leaving at least one prompt token to compute (for its logits)."""
        return self.prefix_cache.match_prefix(input_ids[: len(input_ids) - 1])

    def lock(self, req_handle, unlock: bool = False) -> None:
        self.prefix_cache.lock_handle(req_handle, unlock=unlock)

    # ---- allocation ----------------------------------------------------------------------
    def _take_pages(self, n: int) -> torch.Tensor:
        if n > self.free_pages:
            freed = self.prefix_cache.evict((n - self.free_pages) * self.page_size)
            self._release_slots(freed)
        if n > self.free_pages:
            raise MemoryError(f"out of KV pages: need {n}, have {self.free_pages} (admission control should prevent "
                              "this)")
        self._settle(wait=n > len(self._free_pages))
        pages, self._free_pages = self._free_pages[:n], self._free_pages[n:]
        return pages

    def allocate(self, reqs: Iterable[Req]) -> None:
        """Give every request slots for positions [cached_len, device_len) in its page-table row
        (`TableManager.map_pages`), with pages from the free list (evicting from the prefix cache
        when the free list runs short)."""
        TableManager.map_pages(self.page_table, list(reqs), self.page_size, self._take_pages)

    def _pages_of(self, slots: torch.Tensor) -> torch.Tensor:
        """Page ids (CPU) of a run of whole pages' slots."""
        return slots.cpu().long()[:: self.page_size] // self.page_size

    def _release_slots(self, slots: torch.Tensor) -> None:
        if len(slots) == 0:
            return
        if slots.device.type != "cuda":
            self._free_pages = torch.cat([self._free_pages, self._pages_of(slots)])
            return
        # Reading slots on the GPU back at once would wait for every launched step (the next one
        # included, with overlap) and leave the GPU idle after it. The copy goes on the stream
        # instead, behind the work that still reads the slots; the ids are collected when done.
        firsts = slots[:: self.page_size]
        host = torch.empty(len(firsts), dtype=firsts.dtype, pin_memory=True).copy_(firsts, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        self._in_flight.append((host, done))
        self._in_flight_pages += len(host)
        self._settle(wait=False)

    def _settle(self, wait: bool) -> None:
        """Move freed pages whose ids have reached the host to the free list, oldest first; with
        `wait`, all of them (waiting for their copies)."""
        while self._in_flight and (wait or self._in_flight[0][1].query()):
            host, done = self._in_flight.pop(0)
            done.synchronize()
            self._free_pages = torch.cat([self._free_pages, host.long() // self.page_size])
            self._in_flight_pages -= len(host)

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
        """Every page is in exactly one place: the free list, the prefix cache, or a live request."""
        ps = self.page_size
        self._settle(wait=True)
        self.prefix_cache.check_integrity()
        owned = [self._free_pages, self._pages_of(self.prefix_cache.all_indices())]
        for req in live:
            start, end = req.cache_handle.cached_len, self.owned_pages(req, ps) * ps
            owned.append(self._pages_of(self.page_table[req.table_idx, start:end]))
        pages = torch.cat(owned)
        assert len(pages) == self.num_pages and len(torch.unique(pages)) == self.num_pages, (
            f"KV pages leaked or shared: {len(torch.unique(pages))} distinct of {len(pages)} listed, pool has "
            f"{self.num_pages}"
        )
