"""Messages the API server receives from the tokenizer worker."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from .serde import message


@message
@dataclass
class UserReply:
    """New text for one request. The last reply has `finished=True` and a finish reason."""

    uid: int
    text: str  # only what is new since the previous reply
    finished: bool = False
    finish_reason: Optional[str] = None
    prompt_tokens: int = 0
    completion_tokens: int = 0  # so far
    token_ids: List[int] = field(default_factory=list)  # new tokens since the previous reply


@message
@dataclass
class ErrorReply:
    """The request failed and ends here (before any token, or mid-stream); `status` is the HTTP
    status to return."""

    uid: int
    status: int
    message: str
