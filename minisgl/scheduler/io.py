"""The scheduler as a server process: requests arrive over ZMQ, tokens leave over ZMQ.

`SchedulerIO` only adds the edges to `Scheduler`; the loop body is the same `step()` the
offline `LLM` runs. Tokens produced during one step are sent together, as one message, after
the step -- a decode step of 64 requests is one send, not 64. Like `LLM`, it can lead
tensor-parallel ranks (`tp_size > 1`): only this process talks to the tokenizer.
"""

from __future__ import annotations

import os
from typing import Any, List, Optional

from minisgl.core import Batch, InvalidRequestError, Req, SamplingParams
from minisgl.message import (
    AbortMsg,
    BatchMsg,
    DetokenizeMsg,
    ExitMsg,
    SchedulerErrorMsg,
    StatusMsg,
    StatusQuery,
    UserMsg,
)
from minisgl.utils.mp import ZmqPullQueue, ZmqPushQueue

from .config import SchedulerConfig
from .scheduler import scheduler_bases


class SchedulerIO(*scheduler_bases()):
    def __init__(self, config: SchedulerConfig, recv_addr: str, send_addr: str):
        super().__init__(config)
        self.recv_queue = ZmqPullQueue(recv_addr, bind=True)
        self.send_queue = ZmqPushQueue(send_addr, bind=False)
        self.outbox: List[Any] = []
        self.running = True
        # since start, for the status report (and the server's /metrics)
        self.aborted = 0  # requests ended by an AbortMsg
        self.prompt_tokens = 0  # prompt tokens of admitted requests
        self.prefix_hit_tokens = 0  # of those, the ones found in the prefix cache
        self._integrity, self._integrity_checked_at = True, -1  # see _integrity_ok

    # ---- results out: collected during a step, sent after it ---------------------------------
    def on_token(self, req: Req, token: Optional[int], finish_reason: Optional[str]) -> None:
        self.aborted += finish_reason == "abort"
        details = self.token_details(req) if token is not None else {}
        self.outbox.append(DetokenizeMsg(req.uid, token, finish_reason, **details))

    def on_finish_unstarted(self, uid: int, reason: str) -> None:
        self.aborted += reason == "abort"
        self.outbox.append(DetokenizeMsg(uid, None, reason))

    def flush(self) -> None:
        if self.outbox:
            self.send_queue.put(self.outbox[0] if len(self.outbox) == 1 else BatchMsg(self.outbox))
            self.outbox = []

    def schedule_next_batch(self) -> Optional[Batch]:
        batch = super().schedule_next_batch()
        for r in batch.reqs if batch is not None and batch.phase == "prefill" else []:
            if r.cached_len == r.reused_len:  # just admitted (not a later chunk)
                self.prompt_tokens += r.prompt_len
                self.prefix_hit_tokens += r.cached_len
        return batch

    # ---- requests in -------------------------------------------------------------------------
    def receive(self, timeout_s: Optional[float]) -> List[Any]:
        """Everything waiting. With nothing to run, block (up to `timeout_s`) for the first one.
        JSON requests whose grammar finished compiling beside the loop join the queue here."""
        aside = self.grammar.aside
        if aside is not None and aside.busy and timeout_s is not None:
            timeout_s = min(timeout_s, 0.01)  # a compile may finish any moment: do not sleep through it
        idle = timeout_s is not None and not self.recv_queue.socket.poll(int(timeout_s * 1000))
        got = [] if idle else self.recv_queue.get_nowait()
        for (ids, params, uid), error in self.grammar.compiled():
            try:
                if error is not None:
                    raise InvalidRequestError(error)
                super().add_request(ids, params, uid)
            except InvalidRequestError as e:
                self.outbox.append(SchedulerErrorMsg(uid, str(e)))
        return got

    def add_request(self, input_ids: Any, params: SamplingParams, uid: Optional[int] = None) -> int:
        """On a server, a JSON request first has its grammar compiled beside the loop (`receive`
        adds it once that is done); every other request is added at once."""
        if self.grammar.aside is None or params.json_mode == "off" or uid is None:
            return super().add_request(input_ids, params, uid)
        self.grammar.aside.submit(uid, params, (input_ids, params, uid))
        return uid

    def abort_request(self, uid: int) -> None:
        if self.grammar.aside is not None and self.grammar.aside.cancel(uid):
            self.on_finish_unstarted(uid, "abort")  # still compiling: it never reached the queue
        else:
            super().abort_request(uid)

    def handle(self, msg: Any) -> None:
        if isinstance(msg, BatchMsg):
            for m in msg.msgs:
                self.handle(m)
        elif isinstance(msg, UserMsg):
            try:
                self.add_request(msg.input_ids, msg.sampling_params, uid=msg.uid)
            except InvalidRequestError as e:
                self.outbox.append(SchedulerErrorMsg(msg.uid, str(e)))
        elif isinstance(msg, AbortMsg):
            self.abort_request(msg.uid)
        elif isinstance(msg, StatusQuery):
            self.outbox.append(self.status(msg.uid))
        elif isinstance(msg, ExitMsg):
            self.running = False
        else:
            raise TypeError(f"scheduler got an unexpected {type(msg).__name__}")

    def _integrity_ok(self) -> bool:
        """The full check walks every page (~0.5 s for a CPU pool of 500k pages), so it runs only
        when idle, and once per idle period: status queries (health probes, metrics scrapes)
        must not stall the engine. While busy this is the answer of the last idle check."""
        if self.is_idle and self._integrity_checked_at != self._step:
            try:
                self.check_integrity()
                self._integrity = True
            except AssertionError:
                self._integrity = False
            self._integrity_checked_at = self._step
        return self._integrity

    def status(self, uid: int) -> StatusMsg:
        ok = self._integrity_ok()
        ps = self.cache.page_size
        return StatusMsg(
            uid=uid,
            idle=self.is_idle,
            live_requests=len(self.live),
            free_rows=self.table.available_size,
            total_rows=self.table.max_running_reqs,
            free_pages=self.cache.free_pages,
            cached_pages=self.cache.prefix_cache.size // ps,
            total_pages=self.cache.num_pages,
            integrity_ok=ok,
            max_seq_len=self.max_seq_len,
            aborted_requests=self.aborted,
            waiting_requests=len(self.prefill.pending),
            running_requests=len(self.live),
            prompt_tokens=self.prompt_tokens,
            prefix_hit_tokens=self.prefix_hit_tokens,
        )

    # ---- the loop ----------------------------------------------------------------------------
    def run_forever(self, parent_pid: Optional[int] = None) -> None:
        try:
            while self.running:
                # idle: wait for work (waking each second to notice a dead parent); busy: just peek
                msgs = self.receive(1.0 if self.is_idle else 0.0)
                if not msgs and self.is_idle and parent_pid is not None and os.getppid() != parent_pid:
                    return
                for msg in msgs:
                    self.handle(msg)
                if not self.is_idle:
                    self.step()
                self.flush()
        finally:
            self.shutdown()  # the other tensor-parallel ranks, if any

