"""Exercise overlap-loop (chapter 11): the main loop with overlap scheduling.

Write `Scheduler.step` and `Scheduler.process_results`. Scheduling, `launch` (prepare + forward,
recording a `ForwardResult` in `self.unprocessed`), `_finish_reason`, `_finish`, `_free_if_idle`
and the hooks are the engine's. Grade with `python judge.py overlap-loop`.
"""

from minisgl.scheduler import ForwardResult
from minisgl.scheduler import Scheduler as EngineScheduler


class Scheduler(EngineScheduler):
    def step(self) -> None:
        """One turn: schedule a batch and launch it; then process results. With
        `self.config.overlap`, a batch's results are read only after the next batch is launched
        (every launched result except the one just launched); without it, right away. While a
        JSON request is live (`self.grammar.active`), every launched result is read before
        scheduling. Finish with `self.check_integrity()` when `self.config.check_integrity` is set."""
        raise NotImplementedError("overlap-loop: write Scheduler.step")

    def process_results(self, result: ForwardResult) -> None:
        """Read one launched batch's tokens: take it out of `self.unprocessed`, wait for it, and
        hand each sampled token to its request (`append_host`, its log-probabilities when it
        asked for them, `on_token`, finish if it ends). A request that finished after this batch
        was launched only needs freeing."""
        raise NotImplementedError("overlap-loop: write Scheduler.process_results")
