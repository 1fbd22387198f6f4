"""Exercise io-loop (chapter 14): the scheduler as a server loop.

Write `SchedulerIO.handle`, `SchedulerIO.flush` and `SchedulerIO.run_forever`. `receive`, `status`,
the hooks `on_token` / `on_finish_unstarted` (they append to `self.outbox`) and everything of the
scheduler (`step`, `is_idle`, `add_request`, `abort_request`) are the engine's.
Grade with `python judge.py io-loop`.
"""

import os
from typing import Any, Optional

from minisgl.core import InvalidRequestError
from minisgl.message import AbortMsg, BatchMsg, ExitMsg, SchedulerErrorMsg, StatusQuery, UserMsg
from minisgl.scheduler.io import SchedulerIO as EngineSchedulerIO


class SchedulerIO(EngineSchedulerIO):
    def handle(self, msg: Any) -> None:
        """Act on one received message: a BatchMsg's messages in order; a UserMsg is queued with
        `add_request` (a refusal, InvalidRequestError, becomes a SchedulerErrorMsg for that uid in
        the outbox); an AbortMsg aborts; a StatusQuery puts `self.status(uid)` in the outbox; an
        ExitMsg sets `self.running = False`; anything else raises TypeError."""
        raise NotImplementedError("io-loop: write SchedulerIO.handle")

    def flush(self) -> None:
        """Send the outbox with one `self.send_queue.put`: a single message as itself, several as
        one BatchMsg (in order), nothing at all when it is empty. Then empty it."""
        raise NotImplementedError("io-loop: write SchedulerIO.flush")

    def run_forever(self, parent_pid: Optional[int] = None) -> None:
        """While `self.running`: receive (`self.receive(1.0)` when idle, `self.receive(0.0)` when
        there is work), handle every message, step if not idle, flush. An idle loop that received
        nothing returns when `parent_pid` is given and is no longer the parent process. Whatever
        happens, call `self.shutdown()` on the way out."""
        raise NotImplementedError("io-loop: write SchedulerIO.run_forever")
