"""Log-probabilities in the offline outputs: the `RequestOutput` fields that collect what the
scheduler's `LogprobMixin` reports about each token (`token_details`, under the names of
`DetokenizeMsg`'s fields)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple

from minisgl.utils.settings import extends_in_place

from .llm import RequestOutput, per_token


@extends_in_place(RequestOutput)
@dataclass
class LogprobOutput:
    """For a request that asked for log-probabilities, one entry per token: its log-probability, and
    the most likely (token id, log-probability) pairs at that position, most likely first."""

    logprobs: List[float] = per_token("logprob")
    top_logprobs: List[Tuple[Tuple[int, float], ...]] = per_token("top_logprobs")
