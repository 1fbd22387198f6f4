"""Wrong: the prefix matched at admission stays locked forever."""

import torch

from minisgl.core import Req
from minisgl.scheduler.cache import CacheManager as EngineCacheManager
from minisgl.utils import align_down, div_ceil


class CacheManager(EngineCacheManager):
    def pages_to_finish(self, req: Req) -> int:
        # KV is written for positions below max_device_len - 1 (the last token is never fed back)
        return max(div_ceil(req.max_device_len - 1, self.page_size) - self.owned_pages(req, self.page_size), 0)

    def release(self, req: Req) -> None:
        ps = self.page_size
        owned_end = self.owned_pages(req, ps) * ps
        valid = min(req.cached_len, len(req.input_ids))  # positions whose KV and token are both known
        insert_len = align_down(valid, ps)
        slots = self.page_table[req.table_idx, :owned_end]
        start = req.cache_handle.cached_len
        kept_until = start
        if insert_len > 0:
            kept_until = max(self.prefix_cache.insert_prefix(req.input_ids[:insert_len], slots[:insert_len]), start)
        self._release_slots(slots[start:kept_until])  # duplicates of what the cache already had
        self._release_slots(slots[insert_len:])  # beyond whole pages: not cacheable
