"""Log-probabilities: each chosen token's, and the most likely alternatives at its position.

A request asks with `SamplingParams.logprobs = k >= 0` (the field `LogprobParams` adds). The sampling
plan asks for the sampler's log-probability report (`logprob_report`) with the most alternatives any
row wants; the sampler computes it on the device with the tokens; `launch` starts its copy to the
host beside the tokens', and `take_token` files the chosen token's log-probability and the top k
(id, log-probability) pairs under the request (`token_logprobs`), from where `token_details` hands
the latest to the front ends.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Optional, Set, Tuple

import torch

from minisgl.core import Batch, Req
from minisgl.engine import SamplerOutput, SamplingPlan
from minisgl.engine.logprobs import LOGPROB_REPORT, LogprobParams, LogprobReport

from .config import SchedulerConfig
from .scheduler import ForwardResult, extends_scheduler, to_host

LogprobEntry = Tuple[float, Tuple[Tuple[int, float], ...]]  # (its logprob, top (id, logprob) pairs)


@dataclass
class LogprobResult(ForwardResult):
    logprobs: Optional[LogprobReport] = None  # host copies, when a request of the batch asked
    _lists: Optional[tuple] = field(default=None, repr=False)

    def logprob_lists(self) -> tuple:
        """(chosen logprob per row, top ids per row, top logprobs per row) as Python lists,
        converted once per batch (after `done`)."""
        if self._lists is None:
            out = self.logprobs
            self._lists = (out.logprobs.tolist(), out.top_ids.tolist(), out.top_logprobs.tolist())
        return self._lists


@extends_scheduler("logprobs")
class LogprobMixin:
    """Returns log-probabilities to the requests that ask. Put in front of `Scheduler`."""

    def __init__(self, config: SchedulerConfig, *args: Any, **kwargs: Any):
        super().__init__(config, *args, **kwargs)
        # per live request that asked: one entry per output token, in order
        self.token_logprobs: Dict[int, List[LogprobEntry]] = {}

    def served_params(self) -> Set[type]:
        return super().served_params() | {LogprobParams}

    def sampling_plan(self, batch: Batch, bitmask: Optional[torch.Tensor] = None) -> Optional[SamplingPlan]:
        plan = super().sampling_plan(batch, bitmask)
        top = max(r.sampling_params.logprobs for r in batch.reqs)
        if top < 0:
            return plan
        if plan is None:
            return SamplingPlan(None, reports={LOGPROB_REPORT: top})
        return replace(plan, reports={**plan.reports, LOGPROB_REPORT: top})

    def make_result(self, batch: Batch, sampled: List[bool], out: SamplerOutput) -> ForwardResult:
        base = super().make_result(batch, sampled, out)
        report = out.reports.get(LOGPROB_REPORT)
        if report is None:
            return base
        copies = LogprobReport(to_host(report.logprobs), to_host(report.top_ids), to_host(report.top_logprobs))
        return LogprobResult(base.batch, base.sampled, base.next_tokens, base.done, base.uids, copies)

    def take_token(self, result: ForwardResult, i: int, token: int) -> None:
        super().take_token(result, i, token)
        req = result.batch.reqs[i]
        k = req.sampling_params.logprobs
        if isinstance(result, LogprobResult) and k >= 0:
            chosen, top_ids, top_logprobs = result.logprob_lists()
            kept = self.token_logprobs.setdefault(req.uid, [])
            assert len(kept) == len(req.output_ids) - 1, f"req {req.uid}: logprobs out of step with tokens"
            kept.append((chosen[i], tuple(zip(top_ids[i], top_logprobs[i]))[:k]))

    def token_details(self, req: Req) -> Dict[str, Any]:
        details = super().token_details(req)
        kept = self.token_logprobs.get(req.uid)
        if kept:
            details["logprob"], details["top_logprobs"] = kept[-1]
        return details

    def _free(self, req: Req) -> None:
        super()._free(req)
        self.token_logprobs.pop(req.uid, None)
