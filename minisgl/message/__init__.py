"""Messages between the processes of the server, and their wire format."""

from .backend import AbortMsg, ExitMsg, StatusQuery, UserMsg
from .frontend import ErrorReply, UserReply
from .logprobs import TokenLogprob
from .serde import BatchMsg, SerdeError, deserialize, message, serialize
from .tokenizer import DetokenizeMsg, SchedulerErrorMsg, StatusMsg, TokenizeMsg

__all__ = [
    "AbortMsg",
    "BatchMsg",
    "DetokenizeMsg",
    "ErrorReply",
    "ExitMsg",
    "SchedulerErrorMsg",
    "SerdeError",
    "StatusMsg",
    "StatusQuery",
    "TokenLogprob",
    "TokenizeMsg",
    "UserMsg",
    "UserReply",
    "deserialize",
    "message",
    "serialize",
]
