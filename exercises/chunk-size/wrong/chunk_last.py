"""Wrong: the half-done request waits until new requests are admitted, so it can be starved of budget."""

from typing import List, Optional

from minisgl.core import Batch, Req
from minisgl.scheduler.prefill import PrefillAdder as EnginePrefillAdder
from minisgl.scheduler.prefill import PrefillManager as EnginePrefillManager


class PrefillAdder(EnginePrefillAdder):
    def continue_chunk(self, req: Req) -> Req:
        req.device_len = req.cached_len + min(req.prompt_len - req.cached_len, self.token_budget)
        req.check()
        self.token_budget -= req.extend_len
        return req


class PrefillManager(EnginePrefillManager):
    def schedule_next_batch(self, reserved_pages: int) -> Optional[Batch]:
        adder = EnginePrefillAdder(self.max_extend_tokens, reserved_pages, self.table, self.cache)
        reqs: List[Req] = []
        chunked, self.chunked = self.chunked, None
        while self.pending:
            req = adder.try_admit(self.pending[0])
            if req is None:
                break  # first come, first served: nobody overtakes a request that does not fit
            self.pending.popleft()
            reqs.append(req)
        if chunked is not None:
            reqs.append(adder.continue_chunk(chunked))
        if not reqs:
            return None
        if reqs[-1].is_chunk:  # only the last one can be cut: the budget ran out there
            self.chunked = reqs[-1]
        return Batch(reqs=reqs, phase="prefill")
