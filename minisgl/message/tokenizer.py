"""Messages the tokenizer worker receives: requests from the API server, and tokens from the
scheduler that it turns back into text."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Union

from minisgl.core import SamplingParams

from .serde import message

# a completion prompt (text or token ids) or a chat (a list of {"role", "content"}, or
# {"messages": that list, "tools": the tools offered to the model})
Prompt = Union[str, List[int], List[Dict[str, Any]], Dict[str, Any]]


@message
@dataclass
class TokenizeMsg:
    uid: int
    prompt: Prompt
    chat: bool  # apply the chat template to `prompt` (a list of messages)
    sampling_params: SamplingParams
    max_tokens_from_context: bool = False  # no max_tokens given: run up to the context length
    stop: List[str] = field(default_factory=list)  # stop strings, cut from the text
    echo: bool = False  # the first reply's text starts with the prompt's


@message
@dataclass
class DetokenizeMsg:
    """One generated token. `token` is None when the request ends without a new token (abort)."""

    uid: int
    token: Optional[int]
    finish_reason: Optional[str] = None  # "stop" | "length" | "abort" on the request's last message


@message
@dataclass
class SchedulerErrorMsg:
    """The scheduler refused a request (e.g. it can never fit in memory)."""

    uid: int
    message: str


@message
@dataclass
class StatusMsg:
    """Free resources as the scheduler sees them. `idle` means nothing is queued or running."""

    uid: int
    idle: bool
    live_requests: int
    free_rows: int
    total_rows: int
    free_pages: int
    cached_pages: int  # held by the prefix cache, reusable
    total_pages: int
    integrity_ok: bool
    max_seq_len: int
    aborted_requests: int = 0  # since start: requests ended by an AbortMsg (running or waiting)
    waiting_requests: int = 0  # queued, not admitted yet
    running_requests: int = 0  # admitted: prefilling or decoding
    prompt_tokens: int = 0  # since start: prompt tokens of admitted requests
    prefix_hit_tokens: int = 0  # since start: of those, the ones the prefix cache already held
