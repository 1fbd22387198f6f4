"""`python -m minisgl --shell`: chat with the model in the terminal.

The same scheduler and tokenizer processes as the HTTP server; only the front end differs, and
it is synchronous: read a line, send it with the conversation so far, print text as it streams
(a tokenizer without a chat template gets each line alone, as plain text to complete).
Ctrl-C during a reply aborts it (the scheduler frees the request); Ctrl-D or /exit quits.
"""

from __future__ import annotations

import itertools
import sys
from typing import Dict, Iterator, List, Union

from minisgl.core import SamplingParams
from minisgl.message import AbortMsg, BatchMsg, ErrorReply, TokenizeMsg, UserReply
from minisgl.utils.mp import ZmqPullQueue, ZmqPushQueue

from .args import ServerArgs
from .launch import Backend, say

PROMPT = "> "
HELP = "Type a message. /reset forgets the conversation, /exit (or Ctrl-D) quits, Ctrl-C stops a reply."


class ShellClient:
    def __init__(self, backend: Backend):
        self.to_tokenizer = ZmqPushQueue(backend.addrs.api_to_tokenizer, bind=False)
        self.from_tokenizer = ZmqPullQueue(backend.addrs.tokenizer_to_api, bind=True)
        self._uids = itertools.count()

    def ask(self, prompt: Union[str, List[Dict[str, str]]], params: SamplingParams,
            max_tokens_from_context: bool) -> Iterator[UserReply]:
        """Stream the reply to a conversation (a list of messages) or to plain text (a str)."""
        uid = next(self._uids)
        self.to_tokenizer.put(TokenizeMsg(uid, prompt, not isinstance(prompt, str), params, max_tokens_from_context))
        finished = False
        try:
            while not finished:
                msg = self.from_tokenizer.get()
                for m in msg.msgs if isinstance(msg, BatchMsg) else [msg]:
                    if m.uid != uid:
                        continue  # a reply to an earlier, aborted request
                    if isinstance(m, ErrorReply):
                        finished = True
                        raise RuntimeError(m.message)
                    finished = m.finished
                    yield m
        finally:
            if not finished:
                self.to_tokenizer.put(AbortMsg(uid))


def run_shell(args: ServerArgs, temperature: float = 0.0) -> None:
    limit = args.server.shell_max_tokens
    params = SamplingParams(max_tokens=limit or 1, temperature=temperature)  # 1: replaced by the room left
    with Backend(args, report=lambda what: say(f"waiting for {what}")) as backend:
        client = ShellClient(backend)
        print(f"minisgl shell: {args.model_name} on {backend.info['device']}. {HELP}", flush=True)
        chat = backend.info["chat_template"]
        if not chat:  # nothing to render a conversation with: complete each line as it stands
            print("(the tokenizer has no chat template: each line is completed as plain text, on its own)", flush=True)
        history: List[Dict[str, str]] = []
        while True:
            try:
                line = input(PROMPT)
            except EOFError:
                print()
                break
            except KeyboardInterrupt:
                print()
                continue
            line = line.strip()
            if line in ("/exit", "/quit"):
                break
            if line == "/reset":
                history = []
                print("(conversation cleared)", flush=True)
                continue
            if not line:
                continue
            history.append({"role": "user", "content": line})
            pieces: List[str] = []
            try:
                for reply in client.ask(history if chat else line, params, limit is None):
                    pieces.append(reply.text)
                    sys.stdout.write(reply.text)
                    sys.stdout.flush()
                print(flush=True)
            except KeyboardInterrupt:
                print(" (stopped)", flush=True)
            except RuntimeError as e:
                print(f"error: {e}", flush=True)
                history.pop()
                continue
            history.append({"role": "assistant", "content": "".join(pieces)})
