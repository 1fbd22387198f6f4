"""A complete answer to paged-alloc (the engine's own logic)."""

from typing import Iterable, List

import torch

from minisgl.core import Req
from minisgl.scheduler.cache import CacheManager as EngineCacheManager
from minisgl.utils import div_ceil


class CacheManager(EngineCacheManager):
    def allocate(self, reqs: Iterable[Req]) -> None:
        ps = self.page_size
        rows: List[torch.Tensor] = []
        cols: List[torch.Tensor] = []
        vals: List[torch.Tensor] = []
        for req in reqs:
            # pages [first, last) are new: a partly used page already has its slots
            first, last = div_ceil(req.cached_len, ps), div_ceil(req.device_len, ps)
            if last <= first:
                continue
            pages = self._take_pages(last - first)
            slots = (pages[:, None] * ps + torch.arange(ps)).flatten()
            pos = torch.arange(first * ps, last * ps)
            keep = pos < self.page_table.shape[1]  # the last page may stick out past max_seq_len
            rows.append(torch.full((int(keep.sum()),), req.table_idx))
            cols.append(pos[keep])
            vals.append(slots[keep])
        if rows:
            dev = self.page_table.device
            self.page_table[torch.cat(rows).to(dev), torch.cat(cols).to(dev)] = torch.cat(vals).to(dev, torch.int32)
