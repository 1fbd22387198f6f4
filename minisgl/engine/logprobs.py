"""Log-probabilities, the request field that asks for them: `SamplingParams.logprobs`.

Chapter 6's sampler computes log-probabilities for the rows its plan names; this module lets a
request ask, with `logprobs = k >= 0`: each chosen token's log-probability and the k most likely
alternatives at its position. The scheduler's `LogprobMixin` serves the field and the tokenizer
worker turns what comes back into text; both read it from here, a layer below them.
"""

from __future__ import annotations

from dataclasses import dataclass

from minisgl.core import InvalidRequestError, SamplingParams, is_int
from minisgl.utils.settings import extends_in_place

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
