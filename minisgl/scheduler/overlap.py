"""Overlap scheduling: plan and launch step N+1 while step N runs on the device.

`Scheduler` launches a batch and reads its tokens before planning the next, so the device waits
while the host does its bookkeeping. Here the step that launches batch N+1 reads batch N's
results afterwards: the host's work hides behind the device's. The next step's input tokens do
not need the host: `launch` writes each sampled token into the token pool on the device.

Two rules keep it exact. A request that finished in N may still ride in N+1: its work there is
thrown away, and it is freed only when no launched batch refers to it (`_free`). And the finish
of a request is decided from the tokens it has received on the host, never from what the
device may have computed past them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List

from minisgl.core import Batch, Req
from minisgl.env import declare_switches, switch
from minisgl.utils.settings import extends_config

from .config import SchedulerConfig
from .scheduler import ForwardResult, extends_scheduler


@dataclass(frozen=True)
class OverlapSwitches:
    disable_overlap: bool = field(default=False, metadata=switch(
        "plan step N+1 while step N runs is off unless a front end asks for it"))


OVERLAP_ENV = declare_switches(OverlapSwitches)


@extends_config(SchedulerConfig)
@dataclass(frozen=True)
class OverlapSettings:
    """`SchedulerConfig`'s switch for overlap scheduling."""

    # the one place MINISGL_DISABLE_OVERLAP decides anything: every front end builds the complete
    # SchedulerConfig, and one that names `overlap` (a flag, a keyword) overrides the environment
    overlap: bool = field(default_factory=lambda: not OVERLAP_ENV.disable_overlap, metadata={
        "help": "plan step N+1 while step N runs; default: on, unless MINISGL_DISABLE_OVERLAP=1"})


@extends_scheduler("overlap")
class OverlapMixin:
    """Reads each batch's results after launching the next one, when `config.overlap` is on.
    Put in front of `Scheduler` in a class's bases."""

    def __init__(self, config: SchedulerConfig, *args: Any, **kwargs: Any):
        self.unprocessed: List[ForwardResult] = []  # launched, results not read yet
        super().__init__(config, *args, **kwargs)

    @property
    def is_idle(self) -> bool:
        return super().is_idle and not self.unprocessed

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

    def launch(self, batch: Batch) -> ForwardResult:
        result = super().launch(batch)
        self.unprocessed.append(result)
        return result

    def process_results(self, result: ForwardResult) -> None:
        """Read one launched batch, then free the requests of it that had finished before (they
        rode along), once no other launched batch refers to them."""
        self.unprocessed.remove(result)
        super().process_results(result)
        for req in result.batch.reqs:
            if req.finished and req.uid in self.live:
                self._free(req)

    def _free(self, req: Req) -> None:
        """Free now unless a launched batch still refers to the request's row and pages."""
        if any(req.uid in r.uids for r in self.unprocessed):
            return
        super()._free(req)
