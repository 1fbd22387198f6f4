"""Table rows: each running request owns one row of the page table and of the token pool;
`map_pages` gives a batch's new positions slots in their rows, a page at a time."""

from __future__ import annotations

from typing import Callable, List, Sequence

import numpy as np
import torch

from minisgl.core import Req
from minisgl.utils import div_ceil


class TableManager:
    def __init__(self, max_running_reqs: int, page_table: torch.Tensor):
        self.max_running_reqs = max_running_reqs
        self._free_rows: List[int] = list(reversed(range(max_running_reqs)))
        self.page_table = page_table  # [rows + 1 dummy, max_seq_len] slot of each position
        # token ids by position, on the device: the sampler writes here, the next step reads here,
        # so a decode step never waits for the host to learn the previous token
        self.token_pool = torch.zeros_like(page_table)

    @property
    def available_size(self) -> int:
        return len(self._free_rows)

    def allocate(self) -> int:
        return self._free_rows.pop()

    def free(self, row: int) -> None:
        assert 0 <= row < self.max_running_reqs and row not in self._free_rows, f"row {row} freed twice"
        self._free_rows.append(row)

    def check_integrity(self, used_rows: List[int]) -> None:
        rows = sorted(self._free_rows + used_rows)
        n = self.max_running_reqs
        assert rows == list(range(n)), f"table rows leaked or doubled: {len(rows)} of {n}"

    @staticmethod
    def map_pages(page_table: torch.Tensor, reqs: Sequence[Req], page_size: int,
                  take_pages: Callable[[int], torch.Tensor]) -> None:
        """Give every request slots for positions [cached_len, device_len) in its row of `page_table`.

        A request holds whole pages: position i lives in the request's page i // page_size, at
        slot page * page_size + i % page_size, so only pages that no position below cached_len
        reached are new. `take_pages(n)` returns n free page ids (a CPU int64 tensor, the front of
        the free list first); it is called at most once, for the whole batch, and the requests take
        consecutive runs of those pages in the order given. Positions at or past the table's width
        are not written. The requests themselves are not changed.
        """
        rows: List[int] = []
        firsts: List[int] = []
        counts: List[int] = []
        for req in reqs:
            first, last = div_ceil(req.cached_len, page_size), div_ceil(req.device_len, page_size)
            if last > first:
                rows.append(req.table_idx)
                firsts.append(first)
                counts.append(last - first)
        if not rows:
            return
        # one allocation for the whole batch, then one scatter into the page table: a decode step
        # touches every request, so per-request tensor operations would dominate it
        pages = take_pages(sum(counts)).numpy()
        n = np.array(counts)
        run_start = np.cumsum(n) - n
        page_no = np.arange(len(pages)) - np.repeat(run_start - np.array(firsts), n)
        offs = np.arange(page_size)
        pos = (page_no[:, None] * page_size + offs).ravel()
        slots = (pages[:, None] * page_size + offs).ravel()
        row = np.repeat(np.array(rows), n * page_size)
        keep = pos < page_table.shape[1]
        if not keep.all():
            pos, slots, row = pos[keep], slots[keep], row[keep]
        dev = page_table.device
        packed = torch.from_numpy(np.stack([row, pos, slots]).astype(np.int64))
        if dev.type == "cuda":
            packed = packed.pin_memory()
        packed = packed.to(dev, non_blocking=True)
        page_table[packed[0], packed[1]] = packed[2].to(torch.int32)
