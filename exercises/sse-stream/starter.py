"""Exercise sse-stream (chapter 15): the event lines of one streamed answer.

Write `sse_events`. `sse(obj)` (one event line) and `usage(reply)` are the engine's.
Grade with `python judge.py sse-stream`.
"""

from typing import AsyncIterator, Awaitable, Callable

from minisgl.message import UserReply
from minisgl.server.api import sse, usage


async def sse_events(first: UserReply, next_reply: Callable[[], Awaitable[UserReply]], make_chunk, include_usage: bool) -> AsyncIterator[str]:
    """Yield the event lines: opening chunks, a chunk per reply with text, the finish chunk,
    optionally the usage chunk, then "data: [DONE]\\n\\n"."""
    raise NotImplementedError("sse-stream: write sse_events")
    yield  # (makes this an async generator)
