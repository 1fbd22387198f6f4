"""The scheduler: receive, schedule, prepare, forward, process results.

It owns every resource a request holds (a table row, KV pages) through its managers, and frees
them in one place, `_free`, once per request. Each step launches one batch and reads its tokens
before the next: whole prompts are prefilled first, then the running requests decode together.

Later ideas do not edit this loop. Each is a mixin that overrides a few of its methods and
registers itself with `extends_scheduler`; `scheduler_bases()` stacks every registered mixin
over `Scheduler`, and the front ends (`LLM`, the server's scheduler process) are built on it.
"""

from __future__ import annotations

import itertools
import random
import time
from dataclasses import MISSING, dataclass, field, fields
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Set, Tuple, TypeVar

import numpy as np
import torch

from minisgl.core import Batch, InvalidRequestError, Req, SamplingParams, too_long
from minisgl.engine import Engine, make_sampling_plan
from minisgl.engine.sample import SamplerOutput, SamplingPlan
from minisgl.utils import div_ceil
from minisgl.utils.settings import config_parts

from .decode import DecodeManager
from .pages import PageAllocator
from .prefill import PendingReq, PrefillManager
from .table import TableManager

if TYPE_CHECKING:  # config.py lists the policies registered when it is imported; prefix.py imports this module first
    from .config import SchedulerConfig


@dataclass
class StepTrace:
    """One launched batch, for timelines and tests."""

    step: int
    phase: str
    uids: List[int]
    extend_lens: List[int]
    cached_lens: List[int]
    launched_at: float = field(default_factory=time.perf_counter)  # host clock, seconds

    @property
    def kv_tokens(self) -> int:
        """KV positions the step's attention reads: every request's cached and new tokens."""
        return sum(self.extend_lens) + sum(self.cached_lens)


@dataclass
class ForwardResult:
    batch: Batch
    sampled: List[bool]  # False for a row whose prompt is not computed to its end: no output yet
    next_tokens: torch.Tensor  # [bs] on the CPU, valid once `done` has fired
    done: Optional[torch.cuda.Event]
    uids: frozenset = field(default_factory=frozenset)


def to_host(t: torch.Tensor) -> torch.Tensor:
    """Start copying a device tensor to the host (page-locked, so it is asynchronous)."""
    if t.device.type != "cuda":
        return t
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    return host.copy_(t, non_blocking=True)


class Scheduler:
    def __init__(self, config: SchedulerConfig):
        self.config = config
        self.engine = Engine(config.engine)
        self.device = self.engine.device
        self.eos_ids = set(self.engine.model_config.eos_token_ids)
        self.max_seq_len = self.engine.max_seq_len
        self.table = TableManager(config.engine.max_running_reqs, self.engine.page_table)
        self.cache = self.make_cache()
        self.decode = DecodeManager()
        self.prefill = self.make_prefill_manager()
        self.live: Dict[int, Req] = {}  # admitted and not yet freed
        self.trace: List[StepTrace] = []
        self._step = 0
        self._uids = itertools.count()
        self._seed_rng = random.Random(config.engine.seed)

    def make_cache(self) -> PageAllocator:
        return PageAllocator(self.engine.num_pages, self.engine.page_size, self.engine.page_table)

    def make_prefill_manager(self) -> PrefillManager:
        return PrefillManager(self.table, self.cache, self.config.max_extend_tokens, self.config.new_schedule_policy())

    # ---- the loop ----------------------------------------------------------------------------
    def step(self) -> None:
        """One turn of the main loop, after receiving: schedule, prepare, forward, process."""
        self.launch_and_read()
        if self.config.check_integrity:
            self.check_integrity()

    def launch_and_read(self) -> None:
        """Schedule and launch the next batch, then read its tokens."""
        batch = self.schedule_next_batch()
        if batch is not None:
            self.process_results(self.launch(batch))

    @property
    def is_idle(self) -> bool:
        return not (self.prefill.has_work or self.decode.running)

    # ---- requests in -------------------------------------------------------------------------
    def validate(self, input_ids: Sequence[int], params: SamplingParams) -> None:
        """Raise InvalidRequestError, with the fix, for a request that can never run."""
        n = len(input_ids)
        if n == 0:
            raise InvalidRequestError("the prompt is empty: give at least one token")
        if n + params.max_tokens > self.max_seq_len:
            raise InvalidRequestError(too_long(n, params.max_tokens, self.max_seq_len,
                                               f"the context is {self.max_seq_len} tokens"))
        if params.min_tokens > params.max_tokens:
            raise InvalidRequestError(f"min_tokens ({params.min_tokens}) is larger than max_tokens "
                                      f"({params.max_tokens})")
        vocab = self.engine.model_config.vocab_size
        for name, ids in (("stop_token_ids", params.stop_token_ids), ("logit_bias", [t for t, _ in params.logit_bias])):
            if any(t >= vocab for t in ids):
                raise InvalidRequestError(f"{name} names token {max(ids)}, but the model's vocabulary has {vocab} "
                                          f"tokens (ids 0..{vocab - 1})")
        if unserved := self.unserved(params):
            raise InvalidRequestError(f"this engine cannot honour {', '.join(unserved)}: leave "
                                      f"{'it' if len(unserved) == 1 else 'them'} unset")
        pool_tokens = self.cache.num_pages * self.cache.page_size
        if div_ceil(n + params.max_tokens - 1, self.cache.page_size) > self.cache.num_pages:
            # the last token's KV is never written: prompt plus max_tokens may reach pool_tokens + 1
            raise InvalidRequestError(too_long(n, params.max_tokens, pool_tokens + 1,
                                               f"the KV pool holds {pool_tokens} tokens"))

    def unserved(self, params: SamplingParams) -> List[str]:
        """The fields `params` sets that this scheduler cannot honour, so that no request runs with
        a wish silently dropped: those a later module added to `SamplingParams` (a part, see
        `extends_in_place`) that no mixin of this scheduler serves."""
        served = self.served_params()
        return [f.name for part in config_parts(SamplingParams) if part not in served
                for f in fields(part) if getattr(params, f.name) != _default(f)]

    def served_params(self) -> Set[type]:
        """The parts of `SamplingParams` this scheduler honours: none here; the mixin that serves
        a part adds it."""
        return set()

    def add_request(self, input_ids: Sequence[int] | torch.Tensor, params: SamplingParams,
                    uid: Optional[int] = None) -> int:
        """Queue a request (raises InvalidRequestError before queueing if it can never run)."""
        ids = torch.as_tensor(input_ids, dtype=torch.int32).flatten().cpu()
        self.validate(ids, params)
        uid = next(self._uids) if uid is None else uid
        seed = params.seed if params.seed is not None else self._seed_rng.getrandbits(31)
        self.prefill.add(PendingReq(uid, ids, params, seed))
        return uid

    def abort_request(self, uid: int) -> None:
        if self.prefill.remove_pending(uid) is not None:
            self.on_finish_unstarted(uid, "abort")
            return
        req = self.live.get(uid)
        if req is None or req.finished:
            return
        self._finish(req, "abort")

    # ---- results out (overridden by the offline LLM and the server IO) -----------------------
    def on_token(self, req: Req, token: Optional[int], finish_reason: Optional[str]) -> None:
        """Called once per generated token (None when a request is aborted), with the finish
        reason on the last call."""

    def on_finish_unstarted(self, uid: int, reason: str) -> None:
        """Called when a request ends before it was admitted (aborted while waiting)."""

    def token_details(self, req: Req) -> Dict[str, Any]:
        """What the scheduler computed about the token `req` received last besides its id, by name,
        for `on_token` to pass on: nothing here; a mixin that computes more adds it."""
        return {}

    # ---- schedule and prepare ---------------------------------------------------------------
    def schedule_next_batch(self) -> Optional[Batch]:
        """Prefill first (it shortens waiting), else decode every running request."""
        if not self.prefill.has_work:
            return self.decode.schedule_next_batch()  # nothing to admit: skip the page count
        reserved = sum(self.cache.pages_to_finish(r) for r in self.live.values() if not r.finished)
        batch = self.prefill.schedule_next_batch(reserved)
        if batch is not None:
            for r in batch.reqs:
                self.live[r.uid] = r
            return batch
        return self.decode.schedule_next_batch()

    def prepare(self, batch: Batch) -> None:
        """Allocate KV slots and build the batch's flat token tensors on the device."""
        self.cache.allocate(batch.reqs)
        # index math on the host in a few vectorised operations (a decode step has one token per
        # request, so per-request tensor ops would dominate the step), then one copy to the device
        lens = np.array([r.extend_len for r in batch.reqs])
        starts = np.array([r.cached_len for r in batch.reqs])
        rows = np.array([r.table_idx for r in batch.reqs])
        ends = np.cumsum(lens)
        if len(lens) == ends[-1]:  # one token per request
            pos = starts
        else:
            pos = np.arange(ends[-1]) - np.repeat(ends - lens - starts, lens)
            rows = np.repeat(rows, lens)
        packed = torch.from_numpy(np.concatenate([pos, rows, ends - 1]).astype(np.int64))
        if self.device.type == "cuda":
            packed = packed.pin_memory()  # an asynchronous copy needs page-locked memory
        packed = packed.to(self.device, non_blocking=True)
        n = len(pos)
        pos_d, rows_d = packed[:n], packed[n : 2 * n]
        batch.positions = pos_d
        batch.input_ids = self.table.token_pool[rows_d, pos_d]
        batch.out_loc = self.table.page_table[rows_d, pos_d].long()
        batch.last_indices = packed[2 * n :]

    def sampling_plan(self, batch: Batch, bitmask: Optional[torch.Tensor] = None) -> Optional[SamplingPlan]:
        """What the sampler does to this batch's logits (None: plain greedy); `bitmask`, when given,
        the tokens each row may take (`[bs, ceil(vocab / 32)]` int32 on the host)."""
        return make_sampling_plan(batch.reqs, self.engine.model_config.vocab_size, self.device,
                                  self.table.token_pool, self.eos_ids, bitmask)

    def launch(self, batch: Batch) -> ForwardResult:
        """Prepare and run one batch; its tokens start on their way to the host."""
        self.prepare(batch)
        self.trace.append(StepTrace(self._step, batch.phase, [r.uid for r in batch.reqs],
                                    [r.extend_len for r in batch.reqs], [r.cached_len for r in batch.reqs]))
        self._step += 1
        sampled = [not r.is_chunk for r in batch.reqs]
        out = self.engine.forward_batch(batch, self.sampling_plan(batch))  # moves each ledger on
        self._store_tokens(batch, sampled, out.tokens)
        self.decode.add(r for r, s in zip(batch.reqs, sampled) if s)
        result = self.make_result(batch, sampled, out)
        if self.device.type == "cuda":  # fires once every copy to the host started above is done
            result.done = torch.cuda.Event()
            result.done.record()
        return result

    def make_result(self, batch: Batch, sampled: List[bool], out: SamplerOutput) -> ForwardResult:
        """The record of a launched batch that `process_results` reads, its host copies started."""
        return ForwardResult(batch, sampled, to_host(out.tokens), None, frozenset(r.uid for r in batch.reqs))

    def _store_tokens(self, batch: Batch, sampled: List[bool], tokens: torch.Tensor) -> None:
        """Write each sampled token where the next step reads it, without a host round trip."""
        keep = [i for i, s in enumerate(sampled) if s]
        if not keep:
            return
        where = torch.tensor([keep, [batch.reqs[i].table_idx for i in keep],
                              [batch.reqs[i].device_len - 1 for i in keep]])
        if self.device.type == "cuda":
            where = where.pin_memory()
        where = where.to(self.device, non_blocking=True)
        kept = tokens if len(keep) == len(sampled) else tokens[where[0]]
        self.table.token_pool[where[1], where[2]] = kept

    # ---- process results --------------------------------------------------------------------
    def process_results(self, result: ForwardResult) -> None:
        """Read one launched batch: wait for its tokens and give each request its own. A request
        finished since the batch was launched (aborted) gets nothing."""
        if result.done is not None:
            result.done.synchronize()
        tokens = result.next_tokens.tolist()
        for i, (req, sampled, token) in enumerate(zip(result.batch.reqs, result.sampled, tokens)):
            if sampled and not req.finished:
                self.accept_token(result, i, token)

    def accept_token(self, result: ForwardResult, i: int, token: int) -> None:
        """The `i`-th request of `result`'s batch receives `token`: take it on the host, tell
        `on_token`, and finish the request if the token ends it."""
        req = result.batch.reqs[i]
        self.take_token(result, i, token)
        reason = self._finish_reason(req, token)
        self.on_token(req, token, reason)
        if reason is not None:
            self._finish(req, reason, notify=False)

    def take_token(self, result: ForwardResult, i: int, token: int) -> None:
        """Record `token` in the ledger of the `i`-th request of `result`'s batch."""
        result.batch.reqs[i].append_host(token)

    def _finish_reason(self, req: Req, token: int) -> Optional[str]:
        sp = req.sampling_params
        if (token in self.eos_ids and not sp.ignore_eos) or token in sp.stop_token_ids:
            return "stop"
        if req.input_ids.shape[0] - req.prompt_len >= sp.max_tokens:  # output length, without slicing
            return "length"
        return None

    def _finish(self, req: Req, reason: str, notify: bool = True) -> None:
        req.finished, req.finish_reason = True, reason
        self.decode.remove(req)
        if notify:
            self.on_token(req, None, reason)
        self._free(req)

    def _free(self, req: Req) -> None:
        """The one place a request's resources go back: its pages and its row."""
        assert self.live.pop(req.uid, None) is req, f"request {req.uid} freed twice"
        self.cache.release(req)
        self.table.free(req.table_idx)

    def shutdown(self) -> None:
        """Stop what this scheduler started besides itself: nothing here (a mixin that starts
        processes stops them). Idempotent; the front ends call it when they stop."""

    # ---- checks -------------------------------------------------------------------------------
    def check_integrity(self) -> None:
        live = list(self.live.values())
        self.table.check_integrity([r.table_idx for r in live])
        self.cache.check_integrity(live)

    def assert_all_free(self) -> None:
        """When idle, every row is free, and every page but those the page allocator keeps."""
        assert self.is_idle and not self.live, f"not idle: {len(self.live)} live requests"
        self.check_integrity()
        assert self.table.available_size == self.table.max_running_reqs
        assert self.cache.free_pages + len(self.cache.kept_pages()) == self.cache.num_pages


def _default(f: Any) -> Any:
    return f.default_factory() if f.default is MISSING else f.default


# ---- extensions ---------------------------------------------------------------------------------
S = TypeVar("S", bound=type)
_EXTENSIONS: List[Tuple[str, type]] = []  # (name, mixin), in the order they registered


def extends_scheduler(name: str) -> Callable[[S], S]:
    """Class decorator: register a mixin over `Scheduler`. A mixin registered later sits in front
    of (overrides) those registered before it; registering a name again replaces its mixin."""
    def register(cls: S) -> S:
        _EXTENSIONS[:] = [(n, c) for n, c in _EXTENSIONS if n != name]
        _EXTENSIONS.append((name, cls))
        return cls
    return register


def scheduler_bases() -> Tuple[type, ...]:
    """The bases of a complete scheduler: every registered mixin, last registered first, then
    `Scheduler`. A front end is `class Front(FrontMixin, *scheduler_bases())`."""
    return (*(cls for _, cls in reversed(_EXTENSIONS)), Scheduler)


def scheduler_extensions() -> List[str]:
    """The names of the registered mixins, in registration order."""
    return [n for n, _ in _EXTENSIONS]
