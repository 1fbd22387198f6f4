"""The API server's side of the pipes: one asyncio task reads every reply and routes it, by uid,
to the queue of the HTTP handler waiting for it.

It also knows which requests are open, so that when the engine dies, or a shutdown's drain time
is over, `fail_all` can end every one of them with an error instead of leaving its client hanging.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Set

from minisgl.core import SamplingParams
from minisgl.message import AbortMsg, BatchMsg, ErrorReply, StatusMsg, StatusQuery, TokenizeMsg, UserReply
from minisgl.message.tokenizer import Prompt
from minisgl.utils.mp import ZmqAsyncPullQueue, ZmqAsyncPushQueue

from .launch import Addresses


class RequestFailed(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


class FrontendManager:
    def __init__(self, addrs: Addresses):
        self.to_tokenizer = ZmqAsyncPushQueue(addrs.api_to_tokenizer, bind=False)
        self.from_tokenizer = ZmqAsyncPullQueue(addrs.tokenizer_to_api, bind=True)
        self.queues: Dict[int, asyncio.Queue] = {}
        self.open: Dict[int, "RequestStream"] = {}  # requests not yet finished or closed
        self.last_status: Optional[StatusMsg] = None
        self._uids = itertools.count()
        self._listener: Optional[asyncio.Task] = None
        self._background: Set[asyncio.Task] = set()  # keeps fire-and-forget sends alive

    def start(self) -> None:
        self._listener = asyncio.get_running_loop().create_task(self._listen())

    async def stop(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
        self.to_tokenizer.close()
        self.from_tokenizer.close()

    async def _listen(self) -> None:
        while True:
            msg = await self.from_tokenizer.get()
            for m in msg.msgs if isinstance(msg, BatchMsg) else [msg]:
                q = self.queues.get(m.uid)
                if q is not None:  # else: the handler is gone (client disconnected)
                    q.put_nowait(m)

    def _send_later(self, msg: Any) -> None:
        """Send from code that must not await (a cancelled handler's cleanup)."""
        task = asyncio.get_running_loop().create_task(self.to_tokenizer.put(msg))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def submit(
        self,
        prompt: Prompt,
        chat: bool,
        params: SamplingParams,
        max_tokens_from_context: bool = False,
        stop: Optional[List[str]] = None,
        echo: bool = False,
    ) -> "RequestStream":
        """Send a request; read its replies from the returned stream, and close it when done."""
        stream = RequestStream(self, next(self._uids))
        self.queues[stream.uid] = stream.queue
        self.open[stream.uid] = stream
        try:
            await self.to_tokenizer.put(TokenizeMsg(stream.uid, prompt, chat, params, max_tokens_from_context,
                                                    list(stop or []), echo))
        except BaseException:  # not sent (or cancelled while sending): it must not stay open, or a drain waits for it
            stream.close()
            raise
        return stream

    def fail_all(self, status: int, message: str) -> int:
        """End every open request with an error reply; returns how many there were."""
        streams = list(self.open.values())
        for stream in streams:
            stream.queue.put_nowait(ErrorReply(stream.uid, status, message))
        return len(streams)

    async def status(self, timeout_s: float = 10.0) -> StatusMsg:
        """The scheduler's answer, which comes between two of its steps (raises asyncio.TimeoutError)."""
        uid = next(self._uids)
        q: asyncio.Queue = asyncio.Queue()
        self.queues[uid] = q
        try:
            await self.to_tokenizer.put(StatusQuery(uid))
            self.last_status = await asyncio.wait_for(q.get(), timeout_s)
            return self.last_status
        finally:
            del self.queues[uid]


class RequestStream:
    """Replies of one request. `close()` is synchronous, so any `finally` can call it -- even in a
    handler being cancelled because its client went away; closing early aborts the request."""

    def __init__(self, frontend: FrontendManager, uid: int):
        self.frontend = frontend
        self.uid = uid
        self.queue: asyncio.Queue = asyncio.Queue()
        self.finished = False
        self.closed = False

    async def next(self) -> UserReply:
        """The next reply (the last one has `finished=True`). Raises RequestFailed if refused."""
        assert not self.finished, "the request is over"
        reply = await self.queue.get()
        if isinstance(reply, ErrorReply):
            self.finished = True
            self.frontend.open.pop(self.uid, None)
            raise RequestFailed(reply.status, reply.message)
        self.finished = reply.finished
        if self.finished:
            self.frontend.open.pop(self.uid, None)
        return reply

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.frontend.queues.pop(self.uid, None)
        self.frontend.open.pop(self.uid, None)
        if not self.finished:
            self.frontend._send_later(AbortMsg(self.uid))


@dataclass
class Lifecycle:
    """Whether the server takes requests: not until the engine is ready (`ready`), not while
    draining for a shutdown, and never again once the engine failed to start (`failed` says why)
    or a process of it died (`dead` says which)."""

    ready: bool = False
    failed: Optional[str] = None
    draining: bool = False
    dead: Optional[str] = None
    stop_serving: Callable[[], None] = lambda: None  # set by `serve`: end the HTTP server
    on_ready: Callable[[], None] = lambda: None  # set by `serve`: say so in the terminal

    @property
    def starting(self) -> bool:
        """Still starting, and nothing has gone wrong: a client should come back shortly."""
        return not (self.ready or self.failed or self.dead or self.draining)

    def refusal(self) -> Optional[str]:
        if self.failed:
            return "the engine failed to start (the server's log says why); the server is exiting"  # no server paths
        if self.dead:
            return f"the engine is gone ({self.dead}); the server is exiting"
        if self.draining:
            return "the server is shutting down and takes no new requests"
        if not self.ready:
            return "the engine is starting"
        return None
