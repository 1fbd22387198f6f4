"""The tokenizer worker: between the API server and the scheduler, in both directions.

    API server --TokenizeMsg--> worker --UserMsg--> scheduler
    API server <--UserReply---- worker <--DetokenizeMsg-- scheduler

Going in, it applies the chat template, checks the prompt against the context length and fills
in the default max_tokens. Coming back, it turns tokens into text (one
`IncrementalDetokenizer` per request), names the tokens of any log-probabilities, puts an echoed
prompt in front of the first text, and cuts at stop strings -- asking the scheduler to abort the
request, since the scheduler only knows token ids.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List

import zmq

from minisgl.core import InvalidRequestError, too_long
from minisgl.engine.grammar import JsonParams  # noqa: F401  (declares `SamplingParams.json_mode`, which requests carry)
from minisgl.engine.logprobs import LogprobParams  # noqa: F401  (declares `SamplingParams.logprobs`, read here)
from minisgl.message import (
    AbortMsg,
    BatchMsg,
    DetokenizeMsg,
    ErrorReply,
    ExitMsg,
    SchedulerErrorMsg,
    StatusMsg,
    StatusQuery,
    TokenizeMsg,
    TokenLogprob,
    UserMsg,
    UserReply,
)
from minisgl.utils.mp import ZmqPullQueue, ZmqPushQueue

from .detokenize import IncrementalDetokenizer, StopStringFilter
from .logprobs import TokenTexts
from .tokenize import TokenizeManager


@dataclass
class _Stream:
    """What the worker remembers about one request while it runs."""

    detok: IncrementalDetokenizer
    stop: StopStringFilter
    prompt_tokens: int
    logprobs: bool = False  # name each token's log-probability for the reply
    echo: str = ""  # the prompt's text, until the first reply carries it
    completion_tokens: int = 0
    unsent_ids: List[int] = field(default_factory=list)
    unsent_logprobs: List[TokenLogprob] = field(default_factory=list)


class TokenizerWorker:
    def __init__(self, tokenizer, max_seq_len: int, to_scheduler: ZmqPushQueue, to_api: ZmqPushQueue):
        self.tokenize = TokenizeManager(tokenizer)
        self.texts = TokenTexts(tokenizer)
        self.tokenizer = tokenizer
        self.max_seq_len = max_seq_len
        self.to_scheduler = to_scheduler
        self.to_api = to_api
        self.streams: Dict[int, _Stream] = {}
        self.running = True

    # ---- API server -> scheduler -----------------------------------------------------------
    def on_api_msg(self, msg: Any) -> None:
        if isinstance(msg, TokenizeMsg):
            try:
                self.to_scheduler.put(self._admit(msg))
            except InvalidRequestError as e:
                self.to_api.put(ErrorReply(msg.uid, 400, str(e)))
        elif isinstance(msg, AbortMsg):
            if self.streams.pop(msg.uid, None) is not None:
                self.to_scheduler.put(msg)
        elif isinstance(msg, StatusQuery):
            self.to_scheduler.put(msg)
        elif isinstance(msg, ExitMsg):
            self.running = False
        else:
            raise TypeError(f"tokenizer worker got an unexpected {type(msg).__name__}")

    def _admit(self, msg: TokenizeMsg) -> UserMsg:
        import torch

        ids = self.tokenize.encode(msg.prompt, msg.chat)
        n, ctx = len(ids), self.max_seq_len
        if n == 0:
            raise InvalidRequestError("the prompt is empty: give at least one token")
        params = msg.sampling_params
        if msg.max_tokens_from_context and n >= ctx:  # max_tokens will be what the context leaves: none
            raise InvalidRequestError(f"prompt has {n} tokens but the model's context is {ctx} tokens: shorten the "
                                      f"prompt to at most {ctx - 1} tokens")
        if not msg.max_tokens_from_context and n + params.max_tokens > ctx:  # a fix that is accepted when followed
            raise InvalidRequestError(too_long(n, params.max_tokens, ctx, f"the model's context is {ctx} tokens"))
        if msg.max_tokens_from_context:
            params = dataclasses.replace(params, max_tokens=ctx - n)
        echo = ""
        if msg.echo:
            echo = msg.prompt if isinstance(msg.prompt, str) else self.tokenizer.decode(ids, skip_special_tokens=False)
        self.streams[msg.uid] = _Stream(IncrementalDetokenizer(self.tokenizer), StopStringFilter(msg.stop), n,
                                        params.logprobs >= 0, echo)
        return UserMsg(msg.uid, torch.tensor(ids, dtype=torch.int32), params)

    # ---- scheduler -> API server -----------------------------------------------------------
    def on_scheduler_msg(self, msg: Any) -> List[Any]:
        """Replies for the API server (batched by the caller)."""
        if isinstance(msg, BatchMsg):
            return [r for m in msg.msgs for r in self.on_scheduler_msg(m)]
        if isinstance(msg, DetokenizeMsg):
            return self._on_token(msg)
        if isinstance(msg, SchedulerErrorMsg):
            self.streams.pop(msg.uid, None)
            return [ErrorReply(msg.uid, 400, msg.message)]
        if isinstance(msg, StatusMsg):
            return [msg]
        raise TypeError(f"tokenizer worker got an unexpected {type(msg).__name__}")

    def _on_token(self, msg: DetokenizeMsg) -> List[Any]:
        st = self.streams.get(msg.uid)
        if st is None:  # aborted by the client: the scheduler's last words are not needed
            return []
        text = ""
        if msg.token is not None:
            st.completion_tokens += 1
            st.unsent_ids.append(msg.token)
            if st.logprobs:
                if msg.logprob is None:  # an engine fault: fail this request, keep the worker
                    del self.streams[msg.uid]
                    self.to_scheduler.put(AbortMsg(msg.uid))
                    return [ErrorReply(msg.uid, 500, "the engine sent a token without the log-probability the request "
                                                     "asked for")]
                st.unsent_logprobs.append(self.texts.entry(msg.token, msg.logprob, msg.top_logprobs))
            text = st.detok.add([msg.token])
        if msg.finish_reason is not None:
            text += st.detok.flush()
        safe, stopped = st.stop.push(text)
        reason = msg.finish_reason
        if stopped and reason is None:
            self.to_scheduler.put(AbortMsg(msg.uid))  # the scheduler cannot see text
        if stopped:
            reason = "stop"
        elif reason is not None:
            safe += st.stop.flush()
        if st.echo:  # the prompt goes first, untouched by the stop strings
            safe, st.echo = st.echo + safe, ""
        if not safe and reason is None:
            return []  # nothing certain yet (half a character, or maybe a stop string)
        reply = UserReply(msg.uid, safe, reason is not None, reason, st.prompt_tokens, st.completion_tokens,
                          st.unsent_ids, logprobs=st.unsent_logprobs)
        st.unsent_ids, st.unsent_logprobs = [], []
        if reason is not None:
            del self.streams[msg.uid]
        return [reply]

    # ---- the loop --------------------------------------------------------------------------
    def run(self, from_api: ZmqPullQueue, from_scheduler: ZmqPullQueue, parent_pid: int) -> None:
        poller = zmq.Poller()
        poller.register(from_api.socket, zmq.POLLIN)
        poller.register(from_scheduler.socket, zmq.POLLIN)
        while self.running:
            ready = dict(poller.poll(1000))
            if not ready and os.getppid() != parent_pid:
                return  # the server died without telling us: do not linger as an orphan
            for msg in from_api.get_nowait():
                self.on_api_msg(msg)
            replies = [r for m in from_scheduler.get_nowait() for r in self.on_scheduler_msg(m)]
            if replies:
                self.to_api.put(replies[0] if len(replies) == 1 else BatchMsg(replies))
