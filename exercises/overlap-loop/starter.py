"""Exercise overlap-loop (chapter 11): the main loop with overlap scheduling.

Write `Scheduler.launch_and_read` and `Scheduler.process_results`. `step` calls the first once a
turn; scheduling, `launch` (prepare + forward, recording a `ForwardResult` in
`self.unprocessed`), `accept_token`, `_finish`, `_free_if_idle` and the hooks are the engine's.
Grade with `python judge.py overlap-loop`.
"""

from minisgl.scheduler import ForwardResult
from minisgl.scheduler import Scheduler as EngineScheduler


class Scheduler(EngineScheduler):
    def launch_and_read(self) -> None:
        """Schedule and launch the next batch (if there is one), then read launched results.
        With `self.config.overlap`, batch N's results are read only once batch N+1 is launched;
        without it, a batch's results are read right after its launch. When nothing is left to
        launch, what was launched is still read."""
        raise NotImplementedError("overlap-loop: write Scheduler.launch_and_read")

    def process_results(self, result: ForwardResult) -> None:
        """Read one launched batch: take it out of `self.unprocessed`, wait for its tokens, and
        give each request its token (`self.accept_token`). A request that finished after this
        batch was launched gets nothing and is freed only when no launched batch refers to it;
        a prompt chunk's token is thrown away."""
        raise NotImplementedError("overlap-loop: write Scheduler.process_results")
