"""`PageAllocator`: the one owner of KV pages. Hands pages out from a free list, and takes a
finished request's pages back onto it."""

from __future__ import annotations

from typing import Iterable, List, Tuple

import torch

from minisgl.core import Req
from minisgl.utils import div_ceil

from .table import TableManager


class PageAllocator:
    def __init__(self, num_pages: int, page_size: int, page_table: torch.Tensor):
        self.num_pages = num_pages
        self.page_size = page_size
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
        """Pages that can be handed out now: the free ones."""
        return self.free_pages

    @staticmethod
    def owned_pages(req: Req, page_size: int) -> int:
        """Pages holding this request's KV: [0, cached_len) rounded up to whole pages."""
        return div_ceil(req.cached_len, page_size)

    def pages_to_finish(self, req: Req) -> int:
        """Pages `req` may still need: KV is written for positions below max_device_len - 1."""
        return max(div_ceil(req.max_device_len - 1, self.page_size) - self.owned_pages(req, self.page_size), 0)

    def own_start(self, req: Req) -> int:
        """The first position whose page `req` itself owns: 0, every page of its row is its own."""
        return 0

    def kept_pages(self) -> torch.Tensor:
        """Pages (ids, CPU) held by no live request and not free: none, a page is either."""
        return torch.empty(0, dtype=torch.int64)

    # ---- allocation ----------------------------------------------------------------------
    def reclaim(self, n: int) -> None:
        """Try to put `n` more pages on the free list: nowhere to take them from here (pages come
        back only when requests finish)."""

    def _take_pages(self, n: int) -> torch.Tensor:
        if n > self.free_pages:
            self.reclaim(n - self.free_pages)
        if n > self.free_pages:
            raise MemoryError(f"out of KV pages: need {n}, have {self.free_pages} (admission control should prevent "
                              "this)")
        self._settle(wait=n > len(self._free_pages))
        pages, self._free_pages = self._free_pages[:n], self._free_pages[n:]
        return pages

    def allocate(self, reqs: Iterable[Req]) -> None:
        """Give every request slots for positions [cached_len, device_len) in its page-table row
        (`TableManager.map_pages`), with pages from the free list."""
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
        # Reading slots on the GPU back at once would wait for every launched step and leave the
        # GPU idle after it. The copy goes on the stream
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

    def release(self, req: Req) -> None:
        """Give back every page `req` owns. Called exactly once per request."""
        end = self.owned_pages(req, self.page_size) * self.page_size
        self._release_slots(self.page_table[req.table_idx, self.own_start(req):end])

    # ---- checks --------------------------------------------------------------------------
    def check_integrity(self, live: Iterable[Req]) -> None:
        """Every page is in exactly one place: the free list, `kept_pages`, or a live request."""
        ps = self.page_size
        self._settle(wait=True)
        owned = [self._free_pages, self.kept_pages()]
        for req in live:
            start, end = self.own_start(req), self.owned_pages(req, ps) * ps
            owned.append(self._pages_of(self.page_table[req.table_idx, start:end]))
        pages = torch.cat(owned)
        assert len(pages) == self.num_pages and len(torch.unique(pages)) == self.num_pages, (
            f"KV pages leaked or shared: {len(torch.unique(pages))} distinct of {len(pages)} listed, pool has "
            f"{self.num_pages}"
        )
