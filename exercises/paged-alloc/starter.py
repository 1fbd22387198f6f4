"""Exercise paged-alloc (chapter 4): give requests KV slots in their page-table rows, a page at a time.

Write `TableManager.map_pages`. Before every forward pass the engine calls it for the batch
(`PageAllocator.allocate`), with `take_pages` handing out pages of its free list. Grade with
`python judge.py paged-alloc`.
"""

from typing import Callable, Sequence

import torch

from minisgl.core import Req
from minisgl.scheduler.table import TableManager as EngineTableManager


class TableManager(EngineTableManager):
    @staticmethod
    def map_pages(page_table: torch.Tensor, reqs: Sequence[Req], page_size: int, take_pages: Callable[[int], torch.Tensor]) -> None:
        """Give every request slots for positions [cached_len, device_len) in its row of `page_table`.

        A request holds whole pages: position i lives in the request's page i // page_size, at
        slot page * page_size + i % page_size. `take_pages(n)` returns n free page ids (a CPU int64
        tensor, front of the free list first); call it at most once, for the whole batch, and let
        the requests take consecutive runs of those pages in the order given. Leave positions at
        or past the table's width unwritten, and the requests unchanged.
        """
        raise NotImplementedError("paged-alloc: write TableManager.map_pages")
