"""Wrong: flush sends every message of the outbox on its own, one send per token instead of one per step."""

import os
from typing import Any, Optional

from minisgl.core import InvalidRequestError
from minisgl.message import AbortMsg, BatchMsg, ExitMsg, SchedulerErrorMsg, StatusQuery, UserMsg
from minisgl.scheduler.io import SchedulerIO as EngineSchedulerIO


class SchedulerIO(EngineSchedulerIO):
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

    def flush(self) -> None:
        if self.outbox:
            for m in self.outbox:
                self.send_queue.put(m)
            self.outbox = []

    def run_forever(self, parent_pid: Optional[int] = None) -> None:
        try:
            while self.running:
                msgs = self.receive(1.0 if self.is_idle else 0.0)
                if not msgs and self.is_idle and parent_pid is not None and os.getppid() != parent_pid:
                    return
                for msg in msgs:
                    self.handle(msg)
                if not self.is_idle:
                    self.step()
                self.flush()
        finally:
            self.shutdown()
