"""Text (or a chat) in, token ids out -- the same way the offline `LLM` does it, so a prompt
sent to the server and the same prompt given to `LLM.generate` run the very same tokens.

A chat template is a Jinja program, and one that does not know a message's shape drops it
without a word (a template written for plain turns skips an assistant's tool calls). So after
rendering we check that everything the conversation said made it into the text, and refuse the
request when it did not, rather than let the model answer a conversation it never saw.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Union

from minisgl.core import InvalidRequestError

Prompt = Union[str, List[int], List[Dict[str, Any]]]


def _said(message: Dict[str, Any]) -> List[str]:
    """Pieces of a message that a faithful rendering must contain."""
    pieces = [str(message.get("content") or "").strip()]
    for call in message.get("tool_calls") or ():
        fn = call["function"]
        pieces.append(fn["name"])
        args = fn["arguments"]
        pieces += [json.dumps(v, ensure_ascii=False) if not isinstance(v, str) else v for v in args.values()] if isinstance(args, dict) else [str(args)]
    return [p for p in pieces if p]


class TokenizeManager:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.vocab_size = len(tokenizer)

    def render_chat(self, messages: List[Dict[str, Any]]) -> str:
        """The conversation through the model's chat template, checked to say all it said."""
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise InvalidRequestError("messages must be a list of {role, content} objects")
        try:
            text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        except Exception as e:  # a template error (Jinja, or a `raise_exception` in the template)
            raise InvalidRequestError(f"the model's chat template cannot render these messages: {type(e).__name__}: {e}") from None
        for i, m in enumerate(messages):
            missing = [p for p in _said(m) if p not in text]
            if missing:
                what = "tool calls" if m.get("tool_calls") else f"{m['role']} messages"
                raise InvalidRequestError(f"messages.{i}: the model's chat template cannot render {what} (it left out {missing[0][:40]!r})")
        return text

    def encode(self, prompt: Prompt, chat: bool) -> List[int]:
        if chat:
            # what apply_chat_template(tokenize=True) does: the template writes the special tokens
            return [int(t) for t in self.tokenizer.encode(self.render_chat(prompt), add_special_tokens=False)]
        if isinstance(prompt, str):
            # no BOS added: the same choice as LLM.encode; fall back for tokenizers that need one
            return self.tokenizer.encode(prompt, add_special_tokens=False) or self.tokenizer.encode(prompt)
        bad = [t for t in prompt if not isinstance(t, int) or not 0 <= t < self.vocab_size]
        if bad:
            raise InvalidRequestError(f"prompt: token id {bad[0]!r} is not in the vocabulary [0, {self.vocab_size})")
        return list(prompt)
