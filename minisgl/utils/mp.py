"""ZMQ queues between processes, carrying messages (see `minisgl.message`).

Push/pull: one-to-one, in order, nothing lost (a push before the peer connects is queued).
Pub/sub: one-to-many. Plain PUB drops whatever it sends before a subscriber's subscription has
arrived, so the publisher here counts subscriptions (an XPUB socket reports each one) and
`wait_ready` blocks until all expected subscribers are listening: no message is lost at start-up.

Each queue has a blocking flavour (scheduler, tokenizer worker) and an asyncio flavour
(the API server's event loop).
"""

from __future__ import annotations

import time
from typing import Any, List, Optional

import zmq
import zmq.asyncio

from minisgl.message import deserialize, serialize


class QueueTimeout(TimeoutError):
    pass


def _socket(ctx: zmq.Context, kind: int, addr: str, bind: bool) -> zmq.Socket:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)  # closing never hangs on unsent messages of a dead peer
    if bind:
        sock.bind(addr)
    else:
        sock.connect(addr)
    return sock


class ZmqPushQueue:
    def __init__(self, addr: str, bind: bool, ctx: Optional[zmq.Context] = None):
        self.socket = _socket(ctx or zmq.Context.instance(), zmq.PUSH, addr, bind)

    def put(self, msg: Any) -> None:
        self.socket.send(serialize(msg), copy=False)

    def close(self) -> None:
        self.socket.close()


class ZmqPullQueue:
    def __init__(self, addr: str, bind: bool, ctx: Optional[zmq.Context] = None):
        self.socket = _socket(ctx or zmq.Context.instance(), zmq.PULL, addr, bind)

    def get(self, timeout_s: Optional[float] = None) -> Any:
        """Next message; blocks (up to `timeout_s`, then raises QueueTimeout)."""
        if timeout_s is not None and not self.socket.poll(int(timeout_s * 1000)):
            raise QueueTimeout(f"no message within {timeout_s} s")
        return deserialize(self.socket.recv())

    def get_nowait(self) -> List[Any]:
        """Every message already waiting, possibly none."""
        out = []
        while True:
            try:
                out.append(deserialize(self.socket.recv(zmq.NOBLOCK)))
            except zmq.Again:
                return out

    def close(self) -> None:
        self.socket.close()


class ZmqPubQueue:
    """Publisher that knows how many subscribers to expect and waits for all of them."""

    def __init__(self, addr: str, num_subscribers: int, ctx: Optional[zmq.Context] = None):
        self.socket = (ctx or zmq.Context.instance()).socket(zmq.XPUB)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.XPUB_VERBOSE, 1)  # report every subscription, not only the first per topic
        self.socket.bind(addr)
        self.num_subscribers = num_subscribers
        self.ready = 0

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Block until every expected subscriber's subscription has reached this socket."""
        deadline = time.monotonic() + timeout_s
        while self.ready < self.num_subscribers:
            left = deadline - time.monotonic()
            if left <= 0 or not self.socket.poll(int(left * 1000)):
                raise QueueTimeout(f"{self.ready} of {self.num_subscribers} subscribers connected within {timeout_s} s")
            event = self.socket.recv()
            if event[:1] == b"\x01":  # 1 = subscribe, 0 = unsubscribe
                self.ready += 1

    def put(self, msg: Any) -> None:
        assert self.ready >= self.num_subscribers, "call wait_ready() before publishing"
        self.socket.send(serialize(msg), copy=False)

    def close(self) -> None:
        self.socket.close()


class ZmqSubQueue(ZmqPullQueue):
    """Subscriber to everything a `ZmqPubQueue` publishes."""

    def __init__(self, addr: str, ctx: Optional[zmq.Context] = None):
        self.socket = (ctx or zmq.Context.instance()).socket(zmq.SUB)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.SUBSCRIBE, b"")
        self.socket.connect(addr)


# ---- asyncio flavours (one event loop, no threads) ---------------------------------------


class ZmqAsyncPushQueue:
    def __init__(self, addr: str, bind: bool, ctx: Optional[zmq.asyncio.Context] = None):
        self.socket = _socket(ctx or zmq.asyncio.Context.instance(), zmq.PUSH, addr, bind)

    async def put(self, msg: Any) -> None:
        await self.socket.send(serialize(msg), copy=False)

    def close(self) -> None:
        self.socket.close()


class ZmqAsyncPullQueue:
    def __init__(self, addr: str, bind: bool, ctx: Optional[zmq.asyncio.Context] = None):
        self.socket = _socket(ctx or zmq.asyncio.Context.instance(), zmq.PULL, addr, bind)

    async def get(self) -> Any:
        return deserialize(await self.socket.recv())

    def close(self) -> None:
        self.socket.close()


class ZmqAsyncSubQueue(ZmqAsyncPullQueue):
    def __init__(self, addr: str, ctx: Optional[zmq.asyncio.Context] = None):
        self.socket = (ctx or zmq.asyncio.Context.instance()).socket(zmq.SUB)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.SUBSCRIBE, b"")
        self.socket.connect(addr)
