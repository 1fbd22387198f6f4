"""A complete answer to overlap-loop (the engine's own logic)."""

from minisgl.scheduler import ForwardResult
from minisgl.scheduler import Scheduler as EngineScheduler


class Scheduler(EngineScheduler):
    def step(self) -> None:
        batch = self.schedule_next_batch()
        result = self.launch(batch) if batch is not None else None
        if self.config.overlap:
            # read batch N's tokens only after N+1 is on its way
            for older in [r for r in self.unprocessed if r is not result]:
                self.process_results(older)
        elif result is not None:
            self.process_results(result)
        if self.config.check_integrity:
            self.check_integrity()

    def process_results(self, result: ForwardResult) -> None:
        self.unprocessed.remove(result)
        if result.done is not None:
            result.done.synchronize()
        tokens = result.next_tokens.tolist()
        for req, sampled, token in zip(result.batch.reqs, result.sampled, tokens):
            if req.finished:  # finished earlier (or aborted): this step's work is thrown away
                self._free_if_idle(req)
                continue
            if not sampled:
                continue
            req.append_host(token)
            reason = self._finish_reason(req, token)
            self.on_token(req, token, reason)
            if reason is not None:
                self._finish(req, reason, notify=False)
