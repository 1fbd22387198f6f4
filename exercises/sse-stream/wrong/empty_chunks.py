"""Wrong: a reply with empty text still sends a chunk (an empty delta per held-back token)."""

from typing import AsyncIterator, Awaitable, Callable

from minisgl.message import UserReply
from minisgl.server.api import sse, usage


async def sse_events(first: UserReply, next_reply: Callable[[], Awaitable[UserReply]], make_chunk, include_usage: bool) -> AsyncIterator[str]:
    """The event lines of one streamed request, starting from its first reply.

    Order: the opening chunks (`make_chunk(None, None, start=True)`, a list: chat sends the
    assistant role first), one chunk per reply with text, a final chunk with the finish reason
    and no text, then -- if asked -- a chunk with no choices and the usage, then ``[DONE]``.
    """
    for head in make_chunk(None, None, start=True):
        yield sse(head)
    reply = first
    while True:
        yield sse(make_chunk(reply.text, None))
        if reply.finished:
            break
        reply = await next_reply()
    yield sse(make_chunk(None, reply.finish_reason))
    if include_usage:
        yield sse({**make_chunk(None, None), "choices": [], "usage": usage(reply)})
    yield "data: [DONE]\n\n"
