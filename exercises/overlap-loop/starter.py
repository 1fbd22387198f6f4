"""Exercise overlap-loop (chapter 11): the main loop with overlap scheduling.

Write `OverlapMixin.launch_and_read` and `OverlapMixin.process_results`. `step` calls the first
once a turn; scheduling, `launch` (prepare + forward; the mixin's records the `ForwardResult` in
`self.unprocessed`), the base scheduler's reading of a batch, `_free` (the mixin's defers a
request's freeing while a launched batch refers to it) and the hooks are the engine's.
Grade with `python judge.py overlap-loop`.
"""

from minisgl.scheduler.overlap import OverlapMixin as EngineOverlapMixin
from minisgl.scheduler.scheduler import ForwardResult, Scheduler  # noqa: F401


class OverlapMixin(EngineOverlapMixin):
    def launch_and_read(self) -> None:
        """Schedule and launch the next batch (if there is one), then read launched results.
        With `self.config.overlap`, batch N's results are read only once batch N+1 is launched;
        without it, a batch's results are read right after its launch. When nothing is left to
        launch, what was launched is still read."""
        raise NotImplementedError("overlap-loop: write OverlapMixin.launch_and_read")

    def process_results(self, result: ForwardResult) -> None:
        """Read one launched batch: take it out of `self.unprocessed`, read it as the base
        scheduler does (`Scheduler.process_results`), then free each request of the batch that
        had finished before it was read, unless a batch still in `self.unprocessed` refers to it."""
        raise NotImplementedError("overlap-loop: write OverlapMixin.process_results")
