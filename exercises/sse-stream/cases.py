"""Cases for sse-stream: event lines for scripted reply sequences, with deterministic chunk makers."""

import asyncio
import random
from typing import List

from judge.api import Obs, case
from minisgl.message import UserReply
from minisgl.server import api


def completion_chunk(text, reason, start=False):
    if start:
        return []
    return {"id": "cmpl-1", "object": "text_completion", "choices": [{"index": 0, "text": text or "", "finish_reason": reason}]}


def chat_chunk(text, reason, start=False):
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk"}
    if start:
        return [{**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}]
    return {**base, "choices": [{"index": 0, "delta": {"content": text} if text is not None else {}, "finish_reason": reason}]}


def replies(texts: List[str], reason: str, prompt_tokens: int = 5) -> List[UserReply]:
    out = []
    for i, t in enumerate(texts):
        last = i == len(texts) - 1
        out.append(UserReply(0, t, last, reason if last else None, prompt_tokens, i + 1))
    return out


class CalledTooOften(Exception):
    pass


def run(obs: Obs, label: str, script: List[UserReply], make_chunk, include_usage: bool) -> None:
    calls = [0]
    rest = iter(script[1:])

    async def next_reply() -> UserReply:
        calls[0] += 1
        try:
            return next(rest)
        except StopIteration:
            raise CalledTooOften("next_reply() called after the finished reply") from None

    async def collect():
        return [line async for line in api.sse_events(script[0], next_reply, make_chunk, include_usage)]

    try:
        lines = asyncio.run(collect())
    except CalledTooOften as e:
        lines = [f"raised: {e}"]
    obs.eq(f"{label}: event lines", lines)
    obs.eq(f"{label}: next_reply() calls", calls[0])


@case("a completion in three replies", hint=1)
def completion(obs: Obs) -> None:
    run(obs, "completion, no usage", replies([" Paris", ".", " The"], "length"), completion_chunk, False)


@case("a chat answer with the role chunk first and usage at the end", hint=3)
def chat(obs: Obs) -> None:
    run(obs, "chat with usage", replies(["Hi", " there", "!"], "stop", prompt_tokens=31), chat_chunk, True)


@case("replies with empty text (held back by the detokenizer)", hint=2)
def empty(obs: Obs) -> None:
    run(obs, "chat, empty replies in the middle and at the end", replies(["", "你", "", "好", ""], "stop"), chat_chunk, False)


@case("a one-reply answer", hint=1)
def one(obs: Obs) -> None:
    run(obs, "completion finished in its first reply", replies(["ok"], "length"), completion_chunk, True)
    run(obs, "chat finished with no text at all", replies([""], "stop"), chat_chunk, False)


@case("random reply sequences", seeds=3, hint=2)
def random_scripts(obs: Obs, seed: int) -> None:
    rng = random.Random(seed)
    for i in range(4):
        texts = [rng.choice(["", "a", " b", "é", "🤖", "\n"]) for _ in range(rng.randint(1, 8))]
        maker = rng.choice([completion_chunk, chat_chunk])
        run(obs, f"script {i}", replies(texts, rng.choice(["stop", "length"])), maker, rng.random() < 0.5)
