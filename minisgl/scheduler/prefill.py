"""Admission: which waiting requests join the next prefill batch.

Requests are offered in arrival order (or in another order: see SCHEDULE_POLICIES). A request is
admitted only if a table row is free and the KV pool can hold it to the end (`pages_to_finish`)
on top of what running requests are already promised, so a running request never runs out of
pages. The token budget caps one step's prefill: prompts join whole while the budget lasts, and
the first prompt of a batch joins whatever its length.

A refused request is passed over: those behind it that fit are admitted, so a short chat is not
held behind a request that needs more pages than are free. Two stop the walk instead. A prompt
that may be longer than the budget left leads the next step, where it joins as the first prompt,
so nobody overtakes it for the budget. And a request passed over `MAX_PASSED_OVER` times lets
nothing ahead of it until it fits: a large request waits for running ones to finish, not for ever.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Deque, Dict, List, Optional, Sequence, Tuple, Type, Union

import torch

from minisgl.core import Batch, BaseCacheHandle, Req, SamplingParams
from minisgl.utils import div_ceil

from .pages import PageAllocator
from .table import TableManager


@dataclass
class PendingReq:
    uid: int
    input_ids: torch.Tensor  # [prompt_len] int32, CPU
    sampling_params: SamplingParams
    seed: int
    passed_over: int = 0  # prefill steps that admitted a request behind it while it was refused


# Each pass admits requests ahead of a refused one, and their pages stay promised until they
# finish; 8 lets a burst of short requests by while adding at most 8 batches to a large one's wait.
MAX_PASSED_OVER = 8


@dataclass
class PrefillAdder:
    """Fills one prefill batch. `token_budget` shrinks and `reserved_pages` grows as requests are
    admitted (`spent`: the tokens admitted so far)."""

    token_budget: int
    reserved_pages: int
    table: TableManager
    cache: PageAllocator
    spent: int = 0

    def tokens_to_compute(self, rest: int) -> int:
        """How many of a prompt's `rest` uncomputed tokens this step computes: all of them."""
        return rest

    def try_admit(self, pending: PendingReq) -> Optional[Req]:
        """Admit `pending` into this batch, or return None and change nothing: `admit`, with none
        of its prompt computed before (an empty prefix)."""
        return self.admit(pending, BaseCacheHandle(0))

    def admit(self, pending: PendingReq, prefix: BaseCacheHandle) -> Optional[Req]:
        """Admit `pending`, whose first `prefix.cached_len` tokens already have KV, if a table row
        is free, the budget holds the part of its prompt this step computes (`tokens_to_compute`;
        the batch's first prompt joins whatever its length), and the pool can hold the request to
        its end on top of the pages promised to requests admitted before (`reserved_pages`); else
        return None and change nothing."""
        if self.table.available_size == 0 or self.token_budget <= 0:
            return None
        prompt_len = len(pending.input_ids)
        compute = self.tokens_to_compute(prompt_len - prefix.cached_len)
        if compute > self.token_budget and self.spent > 0:
            return None
        max_len = prompt_len + pending.sampling_params.max_tokens
        ps = self.cache.page_size
        need = div_ceil(max_len - 1, ps) - prefix.cached_len // ps
        if self.cache.available_pages < self.reserved_pages + need:
            return None
        row = self.table.allocate()
        req = Req(pending.input_ids, row, prefix.cached_len, pending.uid, pending.sampling_params, prefix, pending.seed)
        req.device_len = prefix.cached_len + compute
        req.check()
        dev = self.table.token_pool.device
        self.table.token_pool[row, :prompt_len] = pending.input_ids.to(dev, non_blocking=True)
        self.token_budget -= req.extend_len
        self.spent += req.extend_len
        self.reserved_pages += need
        return req


# Scheduling policies: the order in which waiting requests are offered to admission (the queue
# itself stays in arrival order), by name. Each is registered by the module that defines it.
class SchedulePolicy:
    """A scheduling policy. A prefill manager owns one and asks it for an order once per admission
    step (never while no table row is free), so a policy may keep state from one step to the next."""

    summary: ClassVar[str] = ""  # one line for `--schedule-policy`'s help
    settings: ClassVar[Tuple[str, ...]] = ()  # the SchedulerConfig fields `from_config` reads

    @classmethod
    def check_config(cls, config: Any) -> None:
        """Raise ValueError if `config`, a `SchedulerConfig` being built, cannot serve this policy
        (a setting the policy needs says otherwise); nothing to check, unless a policy overrides this."""

    @classmethod
    def from_config(cls, config: Any) -> SchedulePolicy:
        """A fresh policy with the settings it reads from `config`, a `SchedulerConfig` (not imported
        here: the config imports this module); none, unless a policy overrides this."""
        return cls()

    def order(self, waiting: Sequence[PendingReq], cache: PageAllocator) -> List[PendingReq]:
        """The requests of `waiting` (in arrival order) in the order this step offers them, as a new
        list. Locks nothing, and changes neither `waiting` nor its requests."""
        raise NotImplementedError


SCHEDULE_POLICIES: Dict[str, Type[SchedulePolicy]] = {}


def register_schedule_policy(name: str) -> Callable[[Type[SchedulePolicy]], Type[SchedulePolicy]]:
    """Class decorator: make a policy available as `schedule_policy=name`."""
    def register(cls: Type[SchedulePolicy]) -> Type[SchedulePolicy]:
        SCHEDULE_POLICIES[name] = cls
        return cls
    return register


def schedule_policy_class(name: str) -> Type[SchedulePolicy]:
    """The policy registered as `name`; ValueError naming the registered ones if there is none."""
    if name not in SCHEDULE_POLICIES:
        raise ValueError(f"schedule_policy must be one of {', '.join(SCHEDULE_POLICIES)}; got {name!r}")
    return SCHEDULE_POLICIES[name]


def create_schedule_policy(name: str) -> SchedulePolicy:
    """The policy registered as `name`, with its default settings."""
    return schedule_policy_class(name)()


@register_schedule_policy("fcfs")
class FirstComeFirstServed(SchedulePolicy):
    summary = "fcfs: arrival order"

    def order(self, waiting: Sequence[PendingReq], cache: PageAllocator) -> List[PendingReq]:
        return list(waiting)


class PrefillManager:
    """The waiting queue, and the prefill batch each step admits from it."""

    def __init__(self, table: TableManager, cache: PageAllocator, max_extend_tokens: int,
                 schedule_policy: Union[str, SchedulePolicy] = "fcfs"):
        """`schedule_policy`: a policy object (this manager's own: it may keep state), or a
        registered name, for that policy with its default settings."""
        self.table = table
        self.cache = cache
        self.max_extend_tokens = max_extend_tokens
        self.policy = create_schedule_policy(schedule_policy) if isinstance(schedule_policy, str) else schedule_policy
        self.pending: Deque[PendingReq] = deque()  # arrival order, whatever the policy

    @property
    def has_work(self) -> bool:
        """Whether a prefill step has anything to compute."""
        return bool(self.pending)

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
        return self.policy.order(self.pending, self.cache)

    def new_adder(self, reserved_pages: int) -> PrefillAdder:
        return PrefillAdder(self.max_extend_tokens, reserved_pages, self.table, self.cache)

    def admit_in_order(self, adder: PrefillAdder, order: Sequence[PendingReq], reqs: List[Req]) -> List[Req]:
        """Admit from `order` into `reqs`, passing over the requests that are refused, except one
        whose prompt may be longer than the budget left (it leads the next step instead) or one
        passed over `MAX_PASSED_OVER` times already: there the walk stops, as it does once no row
        is left. A refused request with one admitted behind it was passed over once more; the
        admitted leave the queue (the rest keep their arrival order)."""
        admitted, refused, passed = set(), [], 0  # passed: how many of `refused` have one admitted behind them
        for pending in order:
            req = adder.try_admit(pending)
            if req is not None:
                admitted.add(pending.uid)
                reqs.append(req)
                passed = len(refused)
                continue
            over_budget = adder.spent > 0 and len(pending.input_ids) > adder.token_budget
            if over_budget or pending.passed_over >= MAX_PASSED_OVER or not self.table.available_size:
                break
            refused.append(pending)
        for pending in refused[:passed]:
            pending.passed_over += 1
        if admitted:
            self.pending = deque(p for p in self.pending if p.uid not in admitted)
        return reqs

    def schedule_next_batch(self, reserved_pages: int) -> Optional[Batch]:
        """The next prefill batch, or None when no waiting request can be admitted."""
        reqs = self.admit_in_order(self.new_adder(reserved_pages), self.admission_order(), [])
        return Batch(reqs=reqs, phase="prefill") if reqs else None
