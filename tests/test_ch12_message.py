"""Chapter 12: messages and the queues that carry them between processes.

Oracles: the message itself (a round trip must give back equal fields and bit-equal tensors),
and the sender's sequence (a queue must deliver every message, in order, from the very first).
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import threading

import pytest
import torch

from minisgl.core import SamplingParams
from minisgl.message import (
    AbortMsg,
    BatchMsg,
    DetokenizeMsg,
    ErrorReply,
    ExitMsg,
    SerdeError,
    StatusMsg,
    StatusQuery,
    TokenizeMsg,
    UserMsg,
    UserReply,
    deserialize,
    serialize,
)
from minisgl.utils.mp import (
    QueueTimeout,
    ZmqAsyncPullQueue,
    ZmqAsyncPushQueue,
    ZmqPubQueue,
    ZmqPullQueue,
    ZmqPushQueue,
    ZmqSubQueue,
)


def same(a, b) -> bool:
    """Deep equality that compares tensors by dtype and value."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if dataclasses.is_dataclass(a):
        return type(a) is type(b) and all(same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def every_message(rng: random.Random):
    ids = torch.tensor([rng.randrange(50000) for _ in range(rng.randint(0, 300))], dtype=torch.int32)
    sp = SamplingParams(max_tokens=rng.randint(1, 99), temperature=rng.random(), top_k=rng.choice([-1, 5]), seed=rng.choice([None, 7]), stop_token_ids=(2, 9))
    return [
        UserMsg(rng.randrange(10**9), ids, sp),
        AbortMsg(3),
        StatusQuery(4),
        ExitMsg(),
        TokenizeMsg(5, [{"role": "user", "content": "héllo 🤖"}], True, sp, True, ["\n\n", "END"]),
        TokenizeMsg(6, [1, 2, 3], False, sp),
        DetokenizeMsg(7, None, "abort"),
        DetokenizeMsg(8, 42),
        StatusMsg(9, True, 0, 256, 256, 100, 5, 105, True, 2048),
        UserReply(10, "你好", True, "length", 3, 4, [1, 2]),
        ErrorReply(11, 400, "prompt has 9000 tokens but the model's context is 8192 tokens"),
        BatchMsg([DetokenizeMsg(i, i, None) for i in range(rng.randint(0, 64))]),
    ]


@pytest.mark.parametrize("seed", range(5))
def test_every_message_round_trips(seed):
    for msg in every_message(random.Random(seed)):
        back = deserialize(serialize(msg))
        assert same(msg, back), (msg, back)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.float32, torch.bool, torch.uint8])
def test_tensors_travel_as_raw_bytes(dtype):
    t = (torch.randn(1000) * 100).to(dtype)
    back = deserialize(serialize(UserMsg(0, t, SamplingParams())))
    assert back.input_ids.dtype == dtype and torch.equal(back.input_ids, t)
    assert len(serialize(UserMsg(0, t, SamplingParams()))) < t.element_size() * 1000 + 600  # no per-element overhead (the rest: field names)
    back.input_ids[0] = 1  # the receiver owns a writable copy


def test_what_cannot_travel_is_refused_with_the_field_named():
    with pytest.raises(SerdeError, match="UserMsg.input_ids.*1-D"):
        serialize(UserMsg(0, torch.zeros(2, 2, dtype=torch.int32), SamplingParams()))
    with pytest.raises(SerdeError, match="float16"):
        serialize(UserMsg(0, torch.zeros(2, dtype=torch.float16), SamplingParams()))

    @dataclasses.dataclass
    class NotRegistered:
        x: int

    with pytest.raises(SerdeError, match="not a registered message"):
        serialize(BatchMsg([NotRegistered(1)]))
    with pytest.raises(SerdeError, match="cannot send a set"):
        serialize(BatchMsg([{1, 2}]))


# ---- queues ---------------------------------------------------------------------------------


def test_push_pull_delivers_in_order_even_before_the_receiver_binds(tmp_path):
    addr = f"ipc://{tmp_path}/q"
    push = ZmqPushQueue(addr, bind=False)  # connects to nothing yet
    msgs = [DetokenizeMsg(i, i * 3) for i in range(500)]
    for m in msgs[:100]:
        push.put(m)
    pull = ZmqPullQueue(addr, bind=True)
    for m in msgs[100:]:
        push.put(m)
    got = [pull.get(timeout_s=10) for _ in msgs]
    assert got == msgs
    assert pull.get_nowait() == []
    with pytest.raises(QueueTimeout):
        pull.get(timeout_s=0.05)
    push.close()
    pull.close()


def test_pub_sub_handshake_loses_nothing_at_start(tmp_path):
    """Subscribers connect late and at different times; `wait_ready` holds the first message back
    until every one of them is listening, so each receives the full sequence."""
    addr = f"ipc://{tmp_path}/pub"
    pub = ZmqPubQueue(addr, num_subscribers=3)
    results = {}

    def subscriber(k: int) -> None:
        threading.Event().wait(0.05 * k)  # staggered start
        sub = ZmqSubQueue(addr)
        results[k] = [sub.get(timeout_s=20) for _ in range(50)]
        sub.close()

    threads = [threading.Thread(target=subscriber, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    pub.wait_ready(timeout_s=20)
    msgs = [AbortMsg(i) for i in range(50)]
    for m in msgs:
        pub.put(m)
    for t in threads:
        t.join(30)
    assert results == {k: msgs for k in range(3)}
    pub.close()


def test_pub_wait_ready_times_out_when_a_subscriber_is_missing(tmp_path):
    pub = ZmqPubQueue(f"ipc://{tmp_path}/pub", num_subscribers=1)
    with pytest.raises(QueueTimeout, match="0 of 1"):
        pub.wait_ready(timeout_s=0.2)
    pub.close()


def test_async_queues_round_trip(tmp_path):
    addr = f"ipc://{tmp_path}/aq"
    msgs = [UserReply(i, "x" * i, i == 9) for i in range(10)]

    async def main():
        pull = ZmqAsyncPullQueue(addr, bind=True)
        push = ZmqAsyncPushQueue(addr, bind=False)
        for m in msgs:
            await push.put(m)
        got = [await asyncio.wait_for(pull.get(), 10) for _ in msgs]
        push.close()
        pull.close()
        return got

    assert asyncio.run(main()) == msgs
