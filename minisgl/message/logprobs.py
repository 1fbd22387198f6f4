"""Log-probabilities on the wire: the message fields that carry them, from the scheduler to the
tokenizer worker (`DetokenizeMsg.logprob`, `top_logprobs`) and from there, as text, to the API server
(`UserReply.logprobs`, a list of `TokenLogprob`).

Like `LogprobParams` on `SamplingParams`, the fields are a part that `extends_in_place` adds to the
message classes themselves: the classes travel by name, so every process must hold the same fields,
and this module is imported with the message package.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from minisgl.utils.settings import extends_in_place

from .frontend import UserReply
from .serde import message
from .tokenizer import DetokenizeMsg


@message
@dataclass
class TokenLogprob:
    """A token's log-probability as the API reports it: its text, its UTF-8 bytes (a token may
    hold part of a character) and, for a chosen token, the most likely alternatives."""

    token: str
    logprob: float
    bytes: List[int]
    top: List["TokenLogprob"] = field(default_factory=list)


@extends_in_place(DetokenizeMsg)
@dataclass
class DetokenizeLogprobs:
    """With `SamplingParams.logprobs >= 0`, `logprob` is the token's log-probability and
    `top_logprobs` the most likely (token id, log-probability) pairs, most likely first: the names
    under which the scheduler's `LogprobMixin.token_details` reports them."""

    logprob: Optional[float] = None
    top_logprobs: tuple[tuple[int, float], ...] = ()


@extends_in_place(UserReply)
@dataclass
class UserReplyLogprobs:
    logprobs: List[TokenLogprob] = field(default_factory=list)  # one per token in token_ids, if asked
