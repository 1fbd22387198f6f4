"""Chunked prefill: a token budget per step that long prompts are cut to.

Without it a long prompt is prefilled in one step, and every running request waits that long
for its next token. Here a prompt that does not fit in the budget is cut: the step computes what
the budget allows (`ChunkedPrefillAdder.tokens_to_compute`), and its remainder continues first
in the next prefill step (`ChunkedPrefillManager.chunked`), until the prompt is done.

One prompt at a time is half done. Beside it, waiting requests join only whole, and the chunk
leaves them room (`newcomer_share`): up to half the budget, for the leading waiting prompts that
fit in it together. So the prompt at the head of the queue, if at most half the budget, joins the
next prefill step (a row and pages free); one behind a waiting prompt longer than half waits with
it until the chunk is finished, since beside a chunk no prompt overtakes a longer one ahead of it
(`_whole_prompts`). A prefill step that leaves a prompt half done is followed by a decode step, so
every running request still gets a token at least every other step.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

from minisgl.core import Batch, Req

from .config import SchedulerConfig
from .prefill import PendingReq
from .prefix import PrefixAdder, PrefixCacheMixin, PrefixPrefillManager
from .scheduler import extends_scheduler


class ChunkedPrefillAdder(PrefixAdder):
    def tokens_to_compute(self, rest: int) -> int:
        """As much of the rest of a prompt as the budget allows."""
        return min(rest, self.token_budget)

    def continue_chunk(self, req: Req, leave: int = 0) -> Req:
        """The next chunk of a half-done prompt: the budget but `leave` tokens, at most its rest."""
        req.device_len = req.cached_len + min(req.prompt_len - req.cached_len, self.token_budget - leave)
        req.check()
        self.token_budget -= req.extend_len
        self.spent += req.extend_len
        return req


class ChunkedPrefillManager(PrefixPrefillManager):
    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.chunked: Optional[Req] = None  # the request whose prompt is half done, if any

    @property
    def has_work(self) -> bool:
        return bool(self.pending) or self.chunked is not None

    def new_adder(self, reserved_pages: int) -> ChunkedPrefillAdder:
        return ChunkedPrefillAdder(self.max_extend_tokens, reserved_pages, self.table, self.cache)

    def newcomer_share(self, order: Sequence[PendingReq]) -> int:
        """Tokens a continuing chunk leaves to the waiting requests: the whole prompts of the
        leading ones in `order` (as many as there are free rows) that together fit in half the
        budget. A prompt's length bounds what it computes (a prefix hit only makes it less)."""
        share, half = 0, self.max_extend_tokens // 2
        for p in order[: self.table.available_size]:
            if share + len(p.input_ids) > half:
                break
            share += len(p.input_ids)
        return share

    def schedule_next_batch(self, reserved_pages: int) -> Optional[Batch]:
        adder = self.new_adder(reserved_pages)
        order = self.admission_order()
        reqs: List[Req] = []
        if self.chunked is not None:
            reqs.append(adder.continue_chunk(self.chunked, leave=self.newcomer_share(order)))
            self.chunked = None
            # beside a half-done prompt only whole prompts join: one is cut at a time
            order = self._whole_prompts(order, adder.token_budget) if reqs[0].is_chunk else order
        self.admit_in_order(adder, order, reqs)
        if not reqs:
            return None
        # one request at most is half done: the chunk continued first, or the last one admitted
        assert sum(r.is_chunk for r in reqs) <= 1, "two prompts half done in one batch"
        self.chunked = next((r for r in reqs if r.is_chunk), None)
        return Batch(reqs=reqs, phase="prefill")

    @staticmethod
    def _whole_prompts(order: Sequence[PendingReq], budget: int) -> List[PendingReq]:
        """The leading requests of `order` whose whole prompt fits in what is left of `budget`."""
        out: List[PendingReq] = []
        for p in order:
            if len(p.input_ids) > budget:
                break
            out.append(p)
            budget -= len(p.input_ids)
        return out


@extends_scheduler("chunked_prefill")
class ChunkedPrefillMixin(PrefixCacheMixin):
    """Prefill cut to the token budget, and a decode step after every step that leaves a prompt
    half done. It builds on prefix reuse (a prompt's chunks start after its cached prefix), so
    `PrefixCacheMixin` comes with it. Put in front of `Scheduler` in a class's bases."""

    prefill: ChunkedPrefillManager

    def __init__(self, config: SchedulerConfig, *args: Any, **kwargs: Any):
        self._decode_turn = False  # the last step prefilled part of a prompt: decode next
        super().__init__(config, *args, **kwargs)

    def make_prefill_manager(self) -> ChunkedPrefillManager:
        c = self.config
        return ChunkedPrefillManager(self.table, self.cache, c.max_extend_tokens, c.new_schedule_policy())

    def schedule_next_batch(self) -> Optional[Batch]:
        """After a step that left a prompt half done, decode first (a rule of the scheduler's own
        state only, so tensor-parallel ranks make the same choice); then as `Scheduler` does."""
        if self._decode_turn:
            self._decode_turn = False
            batch = self.decode.schedule_next_batch()
            if batch is not None:
                return batch
        batch = super().schedule_next_batch()
        self._decode_turn = batch is not None and batch.phase == "prefill" and self.prefill.chunked is not None
        return batch

    def _finish(self, req: Req, reason: str, notify: bool = True) -> None:
        if self.prefill.chunked is req:
            self.prefill.chunked = None
        super()._finish(req, reason, notify)
