"""Exercise paged-alloc (chapter 4): give requests KV slots, a page at a time.

Write `CacheManager.allocate`. The free list, `_take_pages`, release and the prefix-cache side
are the engine's. Grade with `python judge.py paged-alloc`.
"""

from typing import Iterable, List

import torch

from minisgl.core import Req
from minisgl.scheduler.cache import CacheManager as EngineCacheManager
from minisgl.utils import div_ceil


class CacheManager(EngineCacheManager):
    def allocate(self, reqs: Iterable[Req]) -> None:
        """Give every request slots for positions [cached_len, device_len) in its page-table row.

        Positions below `cached_len` already have slots, and so does the rest of a page that is
        already partly used. Take new pages with `self._take_pages(n)`, request by request, in
        order; page p holds slots p * page_size ... p * page_size + page_size - 1.
        """
        raise NotImplementedError("paged-alloc: write CacheManager.allocate")
