"""Log-probabilities: the request field that asks for them (`SamplingParams.logprobs`) and the
sampler report that computes them.

A request asks with `logprobs = k >= 0`: each chosen token's log-probability and the k most likely
alternatives at its position. The scheduler's `LogprobMixin` serves the field, putting the most
alternatives any row wants in the batch's sampling plan under `LOGPROB_REPORT`; chapter 6's sampler
then runs `logprob_report` after the draw. The tokenizer worker turns what comes back into text;
both read the field from here, a layer below them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minisgl.core import InvalidRequestError, SamplingParams, is_int
from minisgl.utils.settings import extends_in_place

from .sample import after_sampling

MAX_LOGPROBS = 20  # alternatives per token a request may ask for (OpenAI's limit)


@extends_in_place(SamplingParams)
@dataclass(frozen=True)
class LogprobParams:
    """What a request sets to get log-probabilities back."""

    logprobs: int = -1  # -1: off; k >= 0: the chosen token's logprob and the top k alternatives

    def __post_init__(self) -> None:
        if not is_int(self.logprobs) or not -1 <= self.logprobs <= MAX_LOGPROBS:
            raise InvalidRequestError(f"logprobs must be -1 (off) or an integer in [0, {MAX_LOGPROBS}], got "
                                      f"{self.logprobs!r}")


LOGPROB_REPORT = "logprobs"  # the report's name in `SamplingPlan.reports` and `SamplerOutput.reports`


@dataclass
class LogprobReport:
    """One batch's log-probabilities: those of the model's own distribution, `log_softmax(logits)`,
    before penalties, biases, masks and temperature (what transformers calls the raw logits)."""

    logprobs: torch.Tensor  # [bs] float32: log p(the chosen token)
    top_ids: torch.Tensor  # [bs, k] int32: the k most likely tokens, most likely first
    top_logprobs: torch.Tensor  # [bs, k] float32


@after_sampling(LOGPROB_REPORT)
def logprob_report(logits: torch.Tensor, tokens: torch.Tensor, top: int) -> LogprobReport:
    """The chosen tokens' log-probabilities and the `top` most likely alternatives of every row."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    chosen = logprobs.gather(1, tokens.long()[:, None])[:, 0]
    best = logprobs.topk(top, dim=-1)
    return LogprobReport(chosen, best.indices.to(torch.int32), best.values)
