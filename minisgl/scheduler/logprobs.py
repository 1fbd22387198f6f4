"""Log-probabilities: each chosen token's, and the most likely alternatives at its position.

A request asks with `SamplingParams.logprobs = k >= 0`. The sampler computes them on the device
with the tokens; `launch` starts their copy to the host beside the tokens', and `take_token`
files the chosen token's log-probability and the top k (id, log-probability) pairs in the
request's ledger (`Req.token_logprobs`), where the front ends read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from minisgl.core import Batch, SamplingParams
from minisgl.engine import SamplerOutput

from .scheduler import ForwardResult, extends_scheduler, to_host


@dataclass
class LogprobResult(ForwardResult):
    logprobs: Optional[SamplerOutput] = None  # host copies, when a request of the batch asked
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

    def unserved(self, params: SamplingParams) -> List[str]:
        return [name for name in super().unserved(params) if name != "logprobs"]

    def make_result(self, batch: Batch, sampled: List[bool], out: SamplerOutput) -> ForwardResult:
        base = super().make_result(batch, sampled, out)
        if out.logprobs is None:
            return base
        copies = SamplerOutput(out.tokens, to_host(out.logprobs), to_host(out.top_ids), to_host(out.top_logprobs))
        return LogprobResult(base.batch, base.sampled, base.next_tokens, base.done, base.uids, copies)

    def take_token(self, result: ForwardResult, i: int, token: int) -> None:
        super().take_token(result, i, token)
        req = result.batch.reqs[i]
        k = req.sampling_params.logprobs
        if isinstance(result, LogprobResult) and k >= 0:
            chosen, top_ids, top_logprobs = result.logprob_lists()
            req.append_logprobs(chosen[i], tuple(zip(top_ids[i], top_logprobs[i]))[:k])
