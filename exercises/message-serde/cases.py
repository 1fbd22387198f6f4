"""Cases for message-serde: round trips of the server's messages, the wire form, and refusals."""

import dataclasses
import random

import msgpack
import torch

from judge.api import Obs, case
from minisgl.core import SamplingParams
from minisgl.message import (
    AbortMsg,
    BatchMsg,
    DetokenizeMsg,
    ErrorReply,
    ExitMsg,
    StatusMsg,
    StatusQuery,
    TokenizeMsg,
    UserMsg,
    UserReply,
    deserialize,
    serialize,
)


def plain(v):
    """What came back, with every type made visible (a tuple is not a list, int32 is not int64)."""
    if isinstance(v, torch.Tensor):
        return {"tensor": str(v.dtype), "shape": list(v.shape), "values": v.tolist()}
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {"message": type(v).__name__, **{f.name: plain(getattr(v, f.name)) for f in dataclasses.fields(v)}}
    if isinstance(v, tuple):
        return {"tuple": [plain(x) for x in v]}
    if isinstance(v, list):
        return [plain(x) for x in v]
    if isinstance(v, dict):
        return {"dict": {k: plain(x) for k, x in v.items()}}
    if isinstance(v, bytes):
        return {"bytes": len(v)}
    return v


def wire(v):
    """The msgpack-decoded form, bytes shown by length."""
    if isinstance(v, bytes):
        return f"<{len(v)} bytes>"
    if isinstance(v, list):
        return [wire(x) for x in v]
    if isinstance(v, dict):
        return {k: wire(x) for k, x in v.items()}
    return v


def messages(rng: random.Random):
    ids = torch.tensor([rng.randrange(50000) for _ in range(rng.randint(0, 20))], dtype=torch.int32)
    sp = SamplingParams(max_tokens=rng.randint(1, 50), temperature=round(rng.random(), 3), seed=rng.choice([None, 3]), stop_token_ids=tuple(rng.sample(range(100), 2)))
    pool = [
        UserMsg(rng.randrange(1000), ids, sp),
        AbortMsg(rng.randrange(1000)),
        StatusQuery(1),
        ExitMsg(),
        TokenizeMsg(2, [{"role": "user", "content": "héllo 🤖"}], True, sp, True, ["\n\n"]),
        TokenizeMsg(3, [5, 6, 7], False, sp),
        DetokenizeMsg(4, rng.randrange(50000), rng.choice([None, "stop", "length"])),
        DetokenizeMsg(5, None, "abort"),
        UserReply(6, "你好", True, "length", 3, 4, [1, 2]),
        ErrorReply(7, 400, "prompt too long"),
        StatusMsg(8, True, 0, 16, 16, 100, 4, 104, True, 2048),
    ]
    return pool


@case("every kind of server message round-trips", hint=1)
def round_trips(obs: Obs) -> None:
    for msg in messages(random.Random(0)):
        obs.eq(f"{type(msg).__name__}: what deserialize(serialize(msg)) gives", plain(deserialize(serialize(msg))))


@case("tensors of every dtype keep dtype and values", hint=3)
def tensors(obs: Obs) -> None:
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.int32, torch.int64, torch.float32, torch.bool, torch.uint8):
        t = (torch.randn(7, generator=g) * 50).to(dtype)
        sent = t.clone()
        back = deserialize(serialize(UserMsg(0, t, SamplingParams())))
        obs.eq(f"a {dtype} tensor after the round trip", plain(back.input_ids))
        back.input_ids[0] = 1  # the receiver may write to its copy
        obs.eq(f"a {dtype} tensor: the sender's copy is untouched by the receiver's write", torch.equal(t, sent))
    empty = deserialize(serialize(UserMsg(0, torch.empty(0, dtype=torch.int64), SamplingParams())))
    obs.eq("an empty int64 tensor after the round trip", plain(empty.input_ids))


@case("the wire form: tagged maps, tensors as raw bytes", hint=2)
def wire_form(obs: Obs) -> None:
    msg = UserMsg(9, torch.arange(1000, dtype=torch.int32), SamplingParams(max_tokens=5, stop_token_ids=(1, 2)))
    raw = serialize(msg)
    obs.eq("UserMsg with 1000 int32 ids: msgpack-decoded form", wire(msgpack.unpackb(raw, raw=False)))
    obs.eq("UserMsg with 1000 int32 ids: under 4300 bytes in all (no per-element encoding)", len(raw) < 4300)
    obs.eq("BatchMsg of two messages: msgpack-decoded form", wire(msgpack.unpackb(serialize(BatchMsg([AbortMsg(1), DetokenizeMsg(2, 3)])), raw=False)))


@case("what cannot travel is refused, naming the field", hint=2)
def refusals(obs: Obs) -> None:
    @dataclasses.dataclass
    class NotAMessage:
        x: int

    bad = [
        ("a 2-D tensor", UserMsg(0, torch.zeros(2, 2, dtype=torch.int32), SamplingParams()), "UserMsg.input_ids"),
        ("a float16 tensor", UserMsg(0, torch.zeros(2, dtype=torch.float16), SamplingParams()), "UserMsg.input_ids"),
        ("an unregistered dataclass in a batch", BatchMsg([NotAMessage(1)]), "BatchMsg.msgs[0]"),
        ("a set in a batch", BatchMsg([{1, 2}]), "BatchMsg.msgs[0]"),
    ]
    for label, msg, where in bad:
        try:
            serialize(msg)
            obs.eq(f"{label}: exception raised, and does its message name {where}?", ["no exception", False])
        except Exception as e:
            obs.eq(f"{label}: exception raised, and does its message name {where}?", [type(e).__name__, where in str(e)])


@case("random batches of messages", seeds=3, hint=1)
def random_batches(obs: Obs, seed: int) -> None:
    rng = random.Random(seed)
    for i in range(5):
        batch = BatchMsg(rng.sample(messages(rng), rng.randint(0, 6)))
        obs.eq(f"batch {i}: after the round trip", plain(deserialize(serialize(batch))))
