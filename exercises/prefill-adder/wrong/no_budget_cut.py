"""Wrong: admits the whole prompt even when the token budget is smaller (no chunking)."""

from typing import Optional

import torch

from minisgl.core import Req
from minisgl.scheduler.prefill import PendingReq
from minisgl.scheduler.prefill import PrefillAdder as EnginePrefillAdder
from minisgl.utils import div_ceil


class PrefillAdder(EnginePrefillAdder):
    def try_admit(self, pending: PendingReq) -> Optional[Req]:
        if self.table.available_size == 0 or self.token_budget <= 0:
            return None
        handle, indices = self.cache.match(pending.input_ids)
        self.cache.lock(handle)  # locked first, so the check below cannot evict our own prefix
        prompt_len = len(pending.input_ids)
        max_len = prompt_len + pending.sampling_params.max_tokens
        ps = self.cache.page_size
        need = div_ceil(max_len - 1, ps) - handle.cached_len // ps
        if self.cache.available_pages < self.reserved_pages + need:
            self.cache.lock(handle, unlock=True)
            return None
        row = self.table.allocate()
        req = Req(pending.input_ids, row, handle.cached_len, pending.uid, pending.sampling_params, handle, pending.seed)
        req.device_len = prompt_len
        req.check()
        dev = self.table.token_pool.device
        self.table.token_pool[row, :prompt_len] = pending.input_ids.to(dev)
        if handle.cached_len:
            self.table.page_table[row, : handle.cached_len] = indices.to(torch.int32)
        self.token_budget -= req.extend_len
        self.reserved_pages += need
        return req
