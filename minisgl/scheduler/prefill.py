"""Admission: which waiting requests join the next prefill batch, and how much of each.

Requests are offered in arrival order (or longest cached prefix first: see SCHEDULE_POLICIES),
up to the first that does not fit (skipping it would starve long prompts) or that would compute
again a prefix another prompt of the batch is computing (`SHARED_PREFIX_WAIT`). A request is admitted
only if a table row is free and the KV pool can hold it to the end (`pages_to_finish`) on top of
what running requests are already promised, so a running request never runs out of pages. The
token budget caps one step's prefill; a prompt that does not fit is cut, and its remainder
continues first in the next step (chunked prefill).

One prompt at a time is half done. Beside it, waiting requests join only whole, and the chunk
leaves them room (`newcomer_share`): up to half the budget, for the leading waiting prompts that
fit in it. So a short prompt (at most half the budget) waits at most one prefill step behind a
long one, while the long one still advances by at least half the budget per prefill step.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Deque, Dict, List, Optional, Sequence

import torch

from minisgl.core import Batch, BaseCacheHandle, Req, SamplingParams
from minisgl.utils import align_up, div_ceil

from .cache import CacheManager
from .table import TableManager


@dataclass
class PendingReq:
    uid: int
    input_ids: torch.Tensor  # [prompt_len] int32, CPU
    sampling_params: SamplingParams
    seed: int


# A waiting prompt that shares at least this many tokens, past what the cache holds of it, with a
# prompt admitted to the same batch waits for the next step: the scheduler caches every prompt
# when its prefill is launched (`CacheManager.cache_prompt`), so one step later the shared part
# is a cache hit instead of being computed twice. Chat prompts share their template this way.
SHARED_PREFIX_WAIT = 16


def _lead(ids: torch.Tensor) -> bytes:
    return ids[:SHARED_PREFIX_WAIT].numpy().tobytes()


@dataclass
class PrefillAdder:
    """Fills one prefill batch. `reserved_pages` grows as requests are admitted; `prompts` holds
    the admitted prompts (as far as this step computes them), keyed by their first tokens."""

    token_budget: int
    reserved_pages: int
    table: TableManager
    cache: CacheManager
    prompts: Dict[bytes, List[torch.Tensor]] = field(default_factory=dict)

    def computes_prefix_of(self, ids: torch.Tensor, cached_len: int) -> bool:
        """Whether a prompt admitted to this batch computes at least `SHARED_PREFIX_WAIT` tokens of
        `ids` past `cached_len`, in whole pages (only those can be reused from the cache)."""
        need = align_up(cached_len + SHARED_PREFIX_WAIT, self.cache.page_size)
        if need > len(ids) - 1 or not self.cache.prefix_cache.keeps_prefixes:  # a match leaves the last token
            return False
        return any(len(p) >= need and torch.equal(p[:need], ids[:need]) for p in self.prompts.get(_lead(ids), ()))

    def note_admitted(self, req: Req) -> None:
        if req.device_len >= SHARED_PREFIX_WAIT:
            ids = req.input_ids[: req.device_len]
            self.prompts.setdefault(_lead(ids), []).append(ids)

    def continue_chunk(self, req: Req, leave: int = 0) -> Req:
        """The next chunk of a half-done prompt: the budget but `leave` tokens, at most its rest."""
        req.device_len = req.cached_len + min(req.prompt_len - req.cached_len, self.token_budget - leave)
        req.check()
        self.token_budget -= req.extend_len
        return req

    def try_admit(self, pending: PendingReq) -> Optional[Req]:
        """Admit `pending` into this batch, or return None and change nothing. Around `admit`
        (chapter 7's decision), the prefix cache's part: reuse the longest cached prefix, locked
        while the request runs, and wait a step for a prefix a prompt of this batch computes."""
        handle, indices = self.cache.match(pending.input_ids)
        if self.computes_prefix_of(pending.input_ids, handle.cached_len):
            return None  # next step the prefix is cached
        self.cache.lock(handle)  # locked, the prefix's pages leave `available_pages`
        req = self.admit(pending, handle)
        if req is None:
            self.cache.lock(handle, unlock=True)
            return None
        if handle.cached_len:
            self.table.page_table[req.table_idx, : handle.cached_len] = indices.to(torch.int32)
        self.note_admitted(req)
        return req

    def admit(self, pending: PendingReq, prefix: BaseCacheHandle) -> Optional[Req]:
        """Admit `pending`, whose first `prefix.cached_len` tokens already have KV, if a table row
        is free, some token budget is left, and the pool can hold the request to its end on top of
        the pages promised to requests admitted before (`reserved_pages`); else return None and
        change nothing. The request computes as much of the rest of its prompt as the budget allows."""
        if self.table.available_size == 0 or self.token_budget <= 0:
            return None
        prompt_len = len(pending.input_ids)
        max_len = prompt_len + pending.sampling_params.max_tokens
        ps = self.cache.page_size
        need = div_ceil(max_len - 1, ps) - prefix.cached_len // ps
        if self.cache.available_pages < self.reserved_pages + need:
            return None
        row = self.table.allocate()
        req = Req(pending.input_ids, row, prefix.cached_len, pending.uid, pending.sampling_params, prefix, pending.seed)
        req.device_len = prefix.cached_len + min(prompt_len - prefix.cached_len, self.token_budget)
        req.check()
        dev = self.table.token_pool.device
        self.table.token_pool[row, :prompt_len] = pending.input_ids.to(dev, non_blocking=True)
        self.token_budget -= req.extend_len
        self.reserved_pages += need
        return req


# Scheduling policies: the order in which waiting requests are offered to admission (the queue
# itself stays in arrival order). "fcfs": arrival order. "lpm" (longest prefix match): first those
# whose prompt the prefix cache holds the most of; they cost the least to prefill, and while they
# run their prefix stays locked, so the requests sharing it find it still cached instead of evicted
# by unrelated prompts. A steady stream of hits can keep a request without one waiting; production
# engines bound that (SGLang falls back to arrival order when the queue is long).
SCHEDULE_POLICIES = ("fcfs", "lpm")


def longest_prefix_first(waiting: Sequence[PendingReq], cache: CacheManager) -> List[PendingReq]:
    """The waiting requests, longest cached prefix first (as `cache.match` measures what admission
    would reuse); equal prefixes keep their order in `waiting`. Locks nothing and leaves `waiting`
    as it is; matching may split a radix node, which changes no cached content."""
    hits = [cache.match(p.input_ids).handle.cached_len for p in waiting]
    order = sorted(range(len(waiting)), key=lambda i: -hits[i])  # sorted() is stable: ties by arrival
    return [waiting[i] for i in order]


class PrefillManager:
    def __init__(self, table: TableManager, cache: CacheManager, max_extend_tokens: int, schedule_policy: str = "fcfs"):
        if schedule_policy not in SCHEDULE_POLICIES:
            raise ValueError(f"schedule_policy must be one of {', '.join(SCHEDULE_POLICIES)}; got {schedule_policy!r}")
        self.table = table
        self.cache = cache
        self.max_extend_tokens = max_extend_tokens
        self.schedule_policy = schedule_policy
        self.pending: Deque[PendingReq] = deque()  # arrival order, whatever the policy
        self.chunked: Optional[Req] = None  # the request whose prompt is half done, if any

    def add(self, pending: PendingReq) -> None:
        self.pending.append(pending)

    def remove_pending(self, uid: int) -> Optional[PendingReq]:
        for p in self.pending:
            if p.uid == uid:
                self.pending.remove(p)
                return p
        return None

    def admission_order(self) -> List[PendingReq]:
        """The waiting requests in the order this step offers them to admission (none when no
        table row is free: then nothing can be admitted, and matching prompts would be wasted)."""
        if self.table.available_size == 0:
            return []
        if self.schedule_policy == "lpm" and len(self.pending) > 1:
            return longest_prefix_first(self.pending, self.cache)
        return list(self.pending)

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
        adder = PrefillAdder(self.max_extend_tokens, reserved_pages, self.table, self.cache)
        order = self.admission_order()
        reqs: List[Req] = []
        if self.chunked is not None:
            reqs.append(adder.continue_chunk(self.chunked, leave=self.newcomer_share(order)))
            self.chunked = None
        admitted = set()
        for pending in order:
            if reqs and reqs[0].is_chunk and len(pending.input_ids) > adder.token_budget:
                break  # beside a half-done prompt only whole prompts join: one is cut at a time
            req = adder.try_admit(pending)
            if req is None:
                break
            admitted.add(pending.uid)
            reqs.append(req)
        if admitted:  # the rest keep their arrival order
            self.pending = deque(p for p in self.pending if p.uid not in admitted)
        if not reqs:
            return None
        # one request at most is half done: the chunk continued first, or the last one admitted
        assert sum(r.is_chunk for r in reqs) <= 1, "two prompts half done in one batch"
        self.chunked = next((r for r in reqs if r.is_chunk), None)
        return Batch(reqs=reqs, phase="prefill")
