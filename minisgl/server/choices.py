"""One response's choices: each a request in the engine, and the OpenAI shapes they are sent in.

A request with ``n`` choices (or a list of prompts) becomes one engine request per choice; they
differ only in the seed (`protocol.choice_seed`). So that they share the prompt's KV instead of
each computing it, the prompt is first run once on its own with one token to generate: when that
finishes its KV is in the radix cache, and every choice then finds all of the prompt there but
the last token.

`Choice` collects one choice's replies -- text, token log-probabilities, timings -- and makes its
chunks for `sse_events`: the chunk maker reads the log-probabilities of the reply that
`Choice.next` returned last, which is the reply `sse_events` is turning into a chunk.
"""

from __future__ import annotations

import asyncio
import codecs
import time
from typing import Any, Awaitable, Callable, Dict, List, Optional

from minisgl.message import TokenLogprob, UserReply

from .frontend import RequestStream
from .tool_calls import parse_tool_calls


class Choice:
    def __init__(self, index: int, stream: RequestStream, chat: bool, logprobs: bool,
                 waiter: Callable[[Awaitable[UserReply]], Awaitable[UserReply]],
                 tools: bool = False):
        self.index = index
        self.stream = stream
        self.chat = chat
        self.tools = tools  # the model was offered tools: read its calls out of the text
        self.want_logprobs = logprobs
        self.waiter = waiter  # wraps each wait (it gives up when the client goes away)
        self.submitted = time.monotonic()
        self.first_token_s: Optional[float] = None
        self.first: Optional[UserReply] = None
        self.last: Optional[UserReply] = None
        self.texts: List[str] = []
        self.logprobs: List[TokenLogprob] = []
        self._unsent = 0  # log-probabilities not yet in a chunk (the last ones in self.logprobs)
        self._utf8 = codecs.getincrementaldecoder("utf-8")("ignore")
        self._chars = 0  # characters the tokens so far decode to: completions' text_offset

    async def next(self) -> UserReply:
        reply = await self.waiter(self.stream.next())
        if reply.token_ids and self.first_token_s is None:
            self.first_token_s = time.monotonic() - self.submitted
        self.first = self.first or reply
        self.last = reply
        self.texts.append(reply.text)
        self.logprobs += reply.logprobs
        self._unsent += len(reply.logprobs)
        return reply

    async def finish(self) -> "Choice":
        while not self.last.finished:
            await self.next()
        return self

    @property
    def text(self) -> str:
        return "".join(self.texts)

    # ---- log-probabilities in OpenAI's two shapes -----------------------------------------------
    def _take_unsent(self) -> List[TokenLogprob]:
        out = self.logprobs[len(self.logprobs) - self._unsent :] if self._unsent else []
        self._unsent = 0
        return out

    def _chat_logprobs(self, entries: List[TokenLogprob]) -> Optional[Dict[str, Any]]:
        if not self.want_logprobs:
            return None
        top = lambda e: [{"token": t.token, "logprob": t.logprob, "bytes": t.bytes} for t in e.top]  # noqa: E731
        return {"content": [{"token": e.token, "logprob": e.logprob, "bytes": e.bytes,
                             "top_logprobs": top(e)} for e in entries], "refusal": None}

    def _completion_logprobs(self, entries: List[TokenLogprob]) -> Optional[Dict[str, Any]]:
        """Offsets count characters from the start of the choice's text (echo never comes with
        log-probabilities, see CompletionRequest); each entry's bytes are decoded once."""
        if not self.want_logprobs:
            return None
        offsets = []
        for e in entries:
            offsets.append(self._chars)
            self._chars += len(self._utf8.decode(bytes(e.bytes)))
        return {
            "tokens": [e.token for e in entries],
            "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{t.token: t.logprob for t in e.top} for e in entries],
            "text_offset": offsets,
        }

    # ---- chunks (for sse_events) and the choice of a whole response ----------------------------------
    def chunk(self, base: Dict[str, Any], text: Optional[str], reason: Optional[str], start: bool = False) -> Any:
        if self.chat:
            if start:
                choice = {"index": self.index, "delta": {"role": "assistant", "content": ""}}
                return [{**base, "choices": [{**choice, "logprobs": None, "finish_reason": None}]}]
            delta = {"content": text} if text is not None else {}
            lp = self._chat_logprobs(self._take_unsent()) if text is not None or reason is not None else None
            return {**base, "choices": [{"index": self.index, "delta": delta, "logprobs": lp, "finish_reason": reason}]}
        if start:
            return []  # completions streams have no role chunk
        lp = self._completion_logprobs(self._take_unsent()) if text is not None or reason is not None else None
        return {**base, "choices": [{"index": self.index, "text": text or "", "logprobs": lp, "finish_reason": reason}]}

    def final(self) -> Dict[str, Any]:
        reason = self.last.finish_reason
        if self.chat:
            content, calls = self.text, None
            if self.tools:
                parsed = parse_tool_calls(self.text)
                if parsed.tool_calls:
                    content, calls = parsed.content, parsed.tool_calls
                    reason = "tool_calls" if reason == "stop" else reason  # a reply cut by max_tokens stays "length"
            message = {"role": "assistant", "content": content, "refusal": None, "tool_calls": calls}
            return {"index": self.index, "message": message, "logprobs": self._chat_logprobs(self.logprobs),
                    "finish_reason": reason}
        return {"index": self.index, "text": self.text, "logprobs": self._completion_logprobs(self.logprobs),
                "finish_reason": reason}


def total_usage(choices: List[Choice], prompts: int) -> Dict[str, int]:
    """Prompt tokens once per prompt (its choices share them), completion tokens of every choice."""
    per_prompt = len(choices) // prompts
    prompt = sum(c.last.prompt_tokens for c in choices[::per_prompt])
    completion = sum(c.last.completion_tokens for c in choices)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


async def gather_or_cancel(aws: List[Awaitable[Any]]) -> List[Any]:
    """`asyncio.gather` that cancels the others when one fails (a refused choice, a gone client)."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        return await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
