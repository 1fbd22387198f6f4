"""Text (or a chat) in, token ids out -- the same way the offline `LLM` does it, so a prompt
sent to the server and the same prompt given to `LLM.generate` run the very same tokens.

A chat template is a Jinja program, and one that does not know a message's shape drops it
without a word (a template written for plain turns skips an assistant's tool calls). So after
rendering we check that everything the conversation said made it into the text, and refuse the
request when it did not, rather than let the model answer a conversation it never saw.

Tools offered to the model go through the template too, when it can render them: it must read a
`tools` variable and ask for calls in the one format the server parses (`<tool_call>` blocks,
see `minisgl.server.tool_calls`); any other template is refused rather than parsed wrongly.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Union

from minisgl.core import InvalidRequestError
from minisgl.utils.tokenizer import (NO_CHAT_TEMPLATE, PLACEHOLDER_TEXT, has_chat_template, is_placeholder,
                                    template_source)

Prompt = Union[str, List[int], List[Dict[str, Any]], Dict[str, Any]]  # the dict: {"messages", "tools"}
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"


def check_renders_tools(tokenizer) -> None:
    """Raise InvalidRequestError unless the chat template renders `tools` and asks for calls in
    `<tool_call>` blocks."""
    import jinja2
    import jinja2.meta

    source = template_source(tokenizer)
    try:
        reads = jinja2.meta.find_undeclared_variables(jinja2.Environment().parse(source)) if source else set()
    except jinja2.TemplateSyntaxError as e:
        raise InvalidRequestError("tools: the model's chat template could not be read to check that it renders tools "
                                  f"({e})") from None
    if "tools" not in reads:
        raise InvalidRequestError("tools: the model's chat template does not render tools, so they cannot be offered "
                                  "to this model; send the request without tools")
    if TOOL_CALL_OPEN not in source:
        raise InvalidRequestError("tools: the model's chat template renders tools but does not ask for "
                                  f"{TOOL_CALL_OPEN} blocks, the only tool-call format this server reads")


def _said(message: Dict[str, Any]) -> List[str]:
    """Pieces of a message that a faithful rendering must contain."""
    pieces = [str(message.get("content") or "").strip()]
    for call in message.get("tool_calls") or ():
        fn = call["function"]
        pieces.append(fn["name"])
        args = fn["arguments"]
        values = args.values() if isinstance(args, dict) else [str(args)]
        pieces += [v if isinstance(v, str) else json.dumps(v, ensure_ascii=False) for v in values]
    return [p for p in pieces if p]


class TokenizeManager:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.vocab_size = len(tokenizer)

    def render_chat(self, messages: List[Dict[str, Any]], tools: Optional[List[Dict[str, Any]]] = None) -> str:
        """The conversation (and the tools offered, if any) through the model's chat template,
        checked to say all it said."""
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise InvalidRequestError("messages must be a list of {role, content} objects")
        if not has_chat_template(self.tokenizer):
            raise InvalidRequestError(NO_CHAT_TEMPLATE)
        if tools:
            check_renders_tools(self.tokenizer)
        try:
            text = self.tokenizer.apply_chat_template(messages, tools=tools or None, add_generation_prompt=True,
                                                      tokenize=False)
        except Exception as e:  # a template error (Jinja, or a `raise_exception` in the template)
            raise InvalidRequestError(f"the model's chat template cannot render these messages: {type(e).__name__}: "
                                      f"{e}") from None
        for i, tool in enumerate(tools or ()):
            name = tool["function"]["name"]
            if name not in text:
                raise InvalidRequestError(f"tools.{i}: the model's chat template left out the tool {name[:40]!r}")
        for i, m in enumerate(messages):
            missing = [p for p in _said(m) if p not in text]
            if missing:
                what = "tool calls" if m.get("tool_calls") else f"{m['role']} messages"
                raise InvalidRequestError(f"messages.{i}: the model's chat template cannot render {what} (it left out "
                                          f"{missing[0][:40]!r})")
        return text

    def encode(self, prompt: Prompt, chat: bool) -> List[int]:
        if chat:
            messages, tools = (prompt["messages"], prompt["tools"]) if isinstance(prompt, dict) else (prompt, None)
            # what apply_chat_template(tokenize=True) does: the template writes the special tokens
            return [int(t) for t in self.tokenizer.encode(self.render_chat(messages, tools), add_special_tokens=False)]
        if isinstance(prompt, str):
            if is_placeholder(self.tokenizer) and not PLACEHOLDER_TEXT.fullmatch(prompt):
                raise InvalidRequestError("prompt: this model has no tokenizer (random weights), so a text prompt must "
                                          "be token ids written as '<5><17>'; or send a list of token ids")
            # no BOS added: the same choice as LLM.encode; fall back for tokenizers that need one
            return self.tokenizer.encode(prompt, add_special_tokens=False) or self.tokenizer.encode(prompt)
        bad = [t for t in prompt if not isinstance(t, int) or not 0 <= t < self.vocab_size]
        if bad:
            raise InvalidRequestError(f"prompt: token id {bad[0]!r} is not in the vocabulary [0, {self.vocab_size})")
        return list(prompt)
