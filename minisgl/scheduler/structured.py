"""Structured output: requests whose text must be JSON, constrained token by token.

A request asks with `SamplingParams.json_mode` (and `json_schema`), the fields that `JsonParams`
in `minisgl.engine.grammar` adds. A JSON request gets a grammar (compiled there, once per schema)
and a matcher that follows its output. Before each step the matchers fill a bitmask of the tokens each row may
take next, and the sampler masks every other token out, so the output is valid JSON by
construction. The mask for position N+1 needs token N on the host: while a JSON request runs,
every launched batch is read before the next is planned (overlap pauses).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Set

import torch

from minisgl.core import Batch, Req, SamplingParams
from minisgl.engine.grammar import GrammarManager, JsonParams
from minisgl.engine.sample import SamplingPlan

from .config import SchedulerConfig
from .scheduler import extends_scheduler

@extends_scheduler("structured_output")
class StructuredOutputMixin:
    """JSON-constrained requests (`JsonParams`). Put in front of `Scheduler`."""

    def __init__(self, config: SchedulerConfig, *args: Any, **kwargs: Any):
        super().__init__(config, *args, **kwargs)
        self.grammar = GrammarManager(config.engine.model_path, self.engine.model_config.vocab_size, self.eos_ids)

    def step(self) -> None:
        if self.grammar.active:  # a grammar's next bitmask needs the last token on the host
            for older in list(getattr(self, "unprocessed", ())):
                self.process_results(older)
        super().step()

    def served_params(self) -> Set[type]:
        return super().served_params() | {JsonParams}

    def validate(self, input_ids: Sequence[int], params: SamplingParams) -> None:
        super().validate(input_ids, params)
        if params.json_mode != "off":
            self.grammar.compile(params)  # a schema xgrammar cannot use is refused here (compiled once, cached)

    def add_request(self, input_ids: Sequence[int] | torch.Tensor, params: SamplingParams,
                    uid: Optional[int] = None) -> int:
        uid = super().add_request(input_ids, params, uid)
        self.grammar.add(uid, params)  # a JSON request's matcher, from the grammar validate compiled
        return uid

    def abort_request(self, uid: int) -> None:
        if uid not in self.live:  # waiting (or unknown): its matcher goes now
            self.grammar.release(uid)
        super().abort_request(uid)

    def sampling_plan(self, batch: Batch, bitmask: Optional[torch.Tensor] = None) -> Optional[SamplingPlan]:
        assert bitmask is None, "one mask per step: the grammars'"
        return super().sampling_plan(batch, self.grammar.fill(batch.reqs))

    def _free(self, req: Req) -> None:
        freed = req.uid in self.live
        super()._free(req)
        if freed and req.uid not in self.live:
            self.grammar.release(req.uid)
