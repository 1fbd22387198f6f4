"""The scheduler: receive, schedule, prepare, forward, process results.

It owns every resource a request holds (a table row, KV pages, a prefix-cache lock) through its
managers, and frees them in one place, `_free`, once per request. With overlap scheduling the
step that launches batch N+1 processes batch N's results afterwards, so the CPU's bookkeeping
hides behind the GPU's work; a request that finishes in N may still ride in N+1, and is freed
only when no launched batch refers to it.
"""

from __future__ import annotations

import itertools
import random
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch

from minisgl.core import Batch, InvalidRequestError, Req, SamplingParams
from minisgl.engine import Engine, SamplerOutput, make_sampling_plan
from minisgl.engine.grammar import GrammarManager
from minisgl.kvcache import create_prefix_cache
from minisgl.utils import div_ceil

from .cache import CacheManager
from .config import SchedulerConfig
from .decode import DecodeManager
from .prefill import PendingReq, PrefillManager
from .table import TableManager


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
    sampled: List[bool]  # False for a prompt chunk: its token is thrown away
    next_tokens: torch.Tensor  # [bs] on the CPU, valid once `done` has fired
    done: Optional[torch.cuda.Event]
    uids: frozenset = field(default_factory=frozenset)
    logprobs: Optional[SamplerOutput] = None  # host copies of the log-probabilities, when asked
    _logprob_lists: Optional[tuple] = field(default=None, repr=False)

    def logprob_lists(self) -> tuple:
        """(chosen logprob per row, top ids per row, top logprobs per row) as Python lists,
        converted once per batch (after `done`)."""
        if self._logprob_lists is None:
            out = self.logprobs
            self._logprob_lists = (out.logprobs.tolist(), out.top_ids.tolist(), out.top_logprobs.tolist())
        return self._logprob_lists


def _to_host(t: torch.Tensor) -> torch.Tensor:
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
        prefix_cache = create_prefix_cache(config.prefix_cache, self.engine.page_size, self.device)
        self.cache = CacheManager(self.engine.num_pages, self.engine.page_size, prefix_cache, self.engine.page_table)
        self.decode = DecodeManager()
        self.grammar = GrammarManager(config.engine.model_path, self.engine.model_config.vocab_size, self.eos_ids)
        self.prefill = PrefillManager(self.table, self.cache, config.max_extend_tokens, config.schedule_policy)
        self.live: Dict[int, Req] = {}  # admitted and not yet freed
        self.unprocessed: List[ForwardResult] = []  # launched, results not read yet
        self.trace: List[StepTrace] = []
        self._step = 0
        self._decode_turn = False  # the last step prefilled part of a prompt: decode next
        self._uids = itertools.count()
        self._seed_rng = random.Random(config.engine.seed)

    # ---- the loop ----------------------------------------------------------------------------
    def step(self) -> None:
        """One turn of the main loop, after receiving: schedule, prepare, forward, process."""
        if self.grammar.active:  # a grammar's next bitmask needs the last token on the host
            for older in list(self.unprocessed):
                self.process_results(older)
        self.launch_and_read()
        if self.config.check_integrity:
            self.check_integrity()

    def launch_and_read(self) -> None:
        """Schedule and launch the next batch, then read launched results: with overlap, every
        one but the batch just launched (batch N is read while N+1 runs); without, its own."""
        batch = self.schedule_next_batch()
        result = self.launch(batch) if batch is not None else None
        if self.config.overlap:
            # read batch N's tokens only after N+1 is on its way
            for older in [r for r in self.unprocessed if r is not result]:
                self.process_results(older)
        elif result is not None:
            self.process_results(result)

    @property
    def is_idle(self) -> bool:
        return not (self.prefill.pending or self.prefill.chunked or self.decode.running or self.unprocessed)

    # ---- requests in -------------------------------------------------------------------------
    def validate(self, input_ids: Sequence[int], params: SamplingParams) -> None:
        n = len(input_ids)
        if n == 0:
            raise InvalidRequestError("the prompt is empty: give at least one token")
        if n + params.max_tokens > self.max_seq_len:
            if n < self.max_seq_len:
                fix = f"shorten the prompt or lower max_tokens to at most {self.max_seq_len - n}"
            else:
                fix = f"shorten the prompt to at most {self.max_seq_len - 1} tokens"
            raise InvalidRequestError(
                f"prompt has {n} tokens and max_tokens is {params.max_tokens}, but the context is "
                f"{self.max_seq_len} tokens: {fix}"
            )
        if params.min_tokens > params.max_tokens:
            raise InvalidRequestError(f"min_tokens ({params.min_tokens}) is larger than max_tokens "
                                      f"({params.max_tokens})")
        vocab = self.engine.model_config.vocab_size
        for name, ids in (("stop_token_ids", params.stop_token_ids), ("logit_bias", [t for t, _ in params.logit_bias])):
            if any(t >= vocab for t in ids):
                raise InvalidRequestError(f"{name} names token {max(ids)}, but the model's vocabulary has {vocab} "
                                          f"tokens (ids 0..{vocab - 1})")
        if div_ceil(n + params.max_tokens - 1, self.cache.page_size) > self.cache.num_pages:
            raise InvalidRequestError(
                f"prompt ({n}) plus max_tokens ({params.max_tokens}) needs more KV memory than the pool "
                f"holds ({self.cache.num_pages * self.cache.page_size} tokens)"
            )
        if params.json_mode != "off":
            self.grammar.compile(params)  # a schema xgrammar cannot use is refused here (compiled once, cached)

    def add_request(self, input_ids: Sequence[int] | torch.Tensor, params: SamplingParams,
                    uid: Optional[int] = None) -> int:
        """Queue a request (raises InvalidRequestError before queueing if it can never run)."""
        ids = torch.as_tensor(input_ids, dtype=torch.int32).flatten().cpu()
        self.validate(ids, params)
        uid = next(self._uids) if uid is None else uid
        seed = params.seed if params.seed is not None else self._seed_rng.getrandbits(31)
        self.grammar.add(uid, params)  # a JSON request's matcher, from the grammar validate compiled
        self.prefill.add(PendingReq(uid, ids, params, seed))
        return uid

    def abort_request(self, uid: int) -> None:
        if self.prefill.remove_pending(uid) is not None:
            self.grammar.release(uid)
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

    # ---- schedule and prepare ---------------------------------------------------------------
    def schedule_next_batch(self) -> Optional[Batch]:
        """Prefill first (it shortens waiting), but a prefill step that leaves a prompt half done
        is followed by a decode step: while a long prompt is chunked, every running request
        still gets a token at least every other step. (A rule of the scheduler's own state
        only, so tensor-parallel ranks make the same choice.)"""
        if self._decode_turn:
            self._decode_turn = False
            batch = self.decode.schedule_next_batch()
            if batch is not None:
                return batch
        if not self.prefill.pending and self.prefill.chunked is None:
            return self.decode.schedule_next_batch()  # nothing to admit: skip the page count
        reserved = sum(self.cache.pages_to_finish(r) for r in self.live.values() if not r.finished)
        batch = self.prefill.schedule_next_batch(reserved)
        if batch is not None:
            for r in batch.reqs:
                self.live[r.uid] = r
            self._decode_turn = self.prefill.chunked is not None
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
        batch.padded_size = batch.size

    def launch(self, batch: Batch) -> ForwardResult:
        self.prepare(batch)
        self.trace.append(StepTrace(self._step, batch.phase, [r.uid for r in batch.reqs],
                                    [r.extend_len for r in batch.reqs], [r.cached_len for r in batch.reqs]))
        self._step += 1
        sampled = [not r.is_chunk for r in batch.reqs]
        plan = make_sampling_plan(batch.reqs, self.engine.model_config.vocab_size, self.device, self.table.token_pool,
                                  self.eos_ids, self.grammar.fill(batch.reqs))
        out = self.engine.forward_batch(batch, plan)  # moves each ledger on
        if batch.phase == "prefill":  # the next step's admissions may reuse these prompts
            for r in batch.reqs:
                self.cache.cache_prompt(r)
        next_tokens = out.tokens
        # the sampled token goes where the next step will read it, without a host round trip
        keep = [i for i, s in enumerate(sampled) if s]
        if keep:
            where = torch.tensor([keep, [batch.reqs[i].table_idx for i in keep],
                                  [batch.reqs[i].device_len - 1 for i in keep]])
            if self.device.type == "cuda":
                where = where.pin_memory()
            where = where.to(self.device, non_blocking=True)
            kept = next_tokens if len(keep) == len(sampled) else next_tokens[where[0]]
            self.table.token_pool[where[1], where[2]] = kept
        self.decode.add(r for r, s in zip(batch.reqs, sampled) if s)
        logprobs = None
        if out.logprobs is not None:
            logprobs = SamplerOutput(next_tokens, _to_host(out.logprobs), _to_host(out.top_ids),
                                     _to_host(out.top_logprobs))
        host, done = _to_host(next_tokens), None
        if self.device.type == "cuda":
            done = torch.cuda.Event()
            done.record()
        result = ForwardResult(batch, sampled, host, done, frozenset(r.uid for r in batch.reqs), logprobs)
        self.unprocessed.append(result)
        return result

    # ---- process results --------------------------------------------------------------------
    def process_results(self, result: ForwardResult) -> None:
        """Read one launched batch: wait for its tokens and give each request its own. A request
        that finished after the batch was launched gets nothing, and is freed once no launched
        batch refers to it; a prompt chunk's token is thrown away."""
        self.unprocessed.remove(result)
        if result.done is not None:
            result.done.synchronize()
        tokens = result.next_tokens.tolist()
        for i, (req, sampled, token) in enumerate(zip(result.batch.reqs, result.sampled, tokens)):
            if req.finished:  # finished earlier (or aborted); this step's work is thrown away
                self._free_if_idle(req)
                continue
            if not sampled:
                continue
            self.accept_token(result, i, token)

    def accept_token(self, result: ForwardResult, i: int, token: int) -> None:
        """The `i`-th request of `result`'s batch receives `token`: append it on the host (with
        its log-probabilities, when the request asked for them), tell `on_token`, and finish the
        request if the token ends it."""
        req = result.batch.reqs[i]
        req.append_host(token)
        if result.logprobs is not None and req.sampling_params.logprobs >= 0:
            chosen, top_ids, top_logprobs = result.logprob_lists()
            req.append_logprobs(chosen[i], tuple(zip(top_ids[i], top_logprobs[i]))[: req.sampling_params.logprobs])
        reason = self._finish_reason(req, token)
        self.on_token(req, token, reason)
        if reason is not None:
            self._finish(req, reason, notify=False)

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
        if self.prefill.chunked is req:
            self.prefill.chunked = None
        if notify:
            self.on_token(req, None, reason)
        self._free_if_idle(req)

    def _free_if_idle(self, req: Req) -> None:
        """Free now unless a launched batch still refers to the request's row and pages."""
        if any(req.uid in r.uids for r in self.unprocessed):
            return
        self._free(req)

    def _free(self, req: Req) -> None:
        """The one place a request's resources go back: pages (or cache), lock, and row."""
        assert self.live.pop(req.uid, None) is req, f"request {req.uid} freed twice"
        self.grammar.release(req.uid)
        self.cache.release(req)
        self.table.free(req.table_idx)

    # ---- checks -------------------------------------------------------------------------------
    def check_integrity(self) -> None:
        live = list(self.live.values())
        self.table.check_integrity([r.table_idx for r in live])
        self.cache.check_integrity(live)

    def assert_all_free(self) -> None:
        """When idle, every row and every page not held by the prefix cache is free."""
        assert self.is_idle and not self.live, f"not idle: {len(self.live)} live requests"
        self.check_integrity()
        assert self.table.available_size == self.table.max_running_reqs
        assert self.cache.free_pages + self.cache.prefix_cache.size // self.cache.page_size == self.cache.num_pages
        assert self.cache.prefix_cache.protected_size == 0, "a finished request still locks a prefix"
