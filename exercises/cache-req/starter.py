"""Exercise cache-req (chapter 8): what a request holds, and giving it back.

Write `PageAllocator.pages_to_finish` and `CacheManager.release`. Allocation, the free list and
the prefix cache itself are the engine's. Grade with `python judge.py cache-req`.
"""

import torch

from minisgl.core import Req
from minisgl.scheduler.cache import CacheManager as EngineCacheManager
from minisgl.scheduler.pages import PageAllocator as EnginePageAllocator
from minisgl.utils import align_down, div_ceil


class PageAllocator(EnginePageAllocator):
    def pages_to_finish(self, req: Req) -> int:
        """Pages `req` may still need on top of what it owns (`owned_pages`) to reach its end."""
        raise NotImplementedError("cache-req: write PageAllocator.pages_to_finish")


class CacheManager(EngineCacheManager):
    def release(self, req: Req) -> None:
        """Give back everything `req` holds: offer its computed prefix (whole pages whose tokens
        are known) to the prefix cache, free the slots the cache did not take, and unlock the
        prefix it matched at admission. Called exactly once per request."""
        raise NotImplementedError("cache-req: write CacheManager.release")
