"""Chat request bodies: messages (text parts only), tool-call turns, and the chat-only fields.

A conversation that used tools -- an assistant turn with `tool_calls` and no content, then a
`tool` turn with the result -- is accepted and handed to the model's chat template as Hugging
Face templates expect it (arguments as objects); the tokenizer worker then checks the template
really wrote it. Tools offered to the model (`tools`, with `tool_choice` "auto") go to the
template too, where it can render them (else a 400), and the calls the model writes come back as
`tool_calls` (`tool_calls.py`). Forcing a call ("required", a named function) is refused: nothing
here constrains the model to call one; so is streaming with tools, since a call can only be told
from text once it is complete.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Literal, Optional, Tuple, Union

from pydantic import Field, model_validator

from .errors import MAX_DEPTH, json_depth
from .protocol import MAX_TOP_LOGPROBS, I32_MAX, ResponseFormat, Unsupported, _Common, _Strict, quote


class ToolCallFunction(_Strict):
    name: str
    arguments: str  # JSON text, as the model wrote it

    @model_validator(mode="after")
    def _json_arguments(self) -> "ToolCallFunction":
        # the body's depth guard cannot see inside a string, and json.loads recurses once per level
        depth = json_depth(self.arguments.encode("utf-8", "replace"))
        if depth > MAX_DEPTH:
            raise Unsupported("arguments", f"nests {depth} levels deep; this server accepts at most {MAX_DEPTH}")
        try:
            json.loads(self.arguments)
        except json.JSONDecodeError as e:
            reason = f"{e.msg} at character {e.pos}"
            raise Unsupported("arguments", f"is not JSON ({reason}): {quote(self.arguments)}") from None
        return self


class ToolCall(_Strict):
    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ToolFunction(_Strict):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")  # OpenAI's rule for names
    description: Optional[str] = None
    parameters: Optional[Dict[str, Any]] = None  # a JSON schema, shown to the model by the template
    strict: Optional[bool] = None

    @model_validator(mode="after")
    def _not_strict(self) -> "ToolFunction":
        if self.strict:
            raise Unsupported("strict", "true is not supported: the arguments are not constrained to the schema")
        return self


class Tool(_Strict):
    type: Literal["function"]
    function: ToolFunction


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Optional[Union[str, List[Dict[str, Any]]]] = None
    tool_calls: Optional[List[ToolCall]] = None  # assistant turns that called tools
    tool_call_id: Optional[str] = None  # tool turns: which call this answers
    # what the official client sends back when a reply is passed on as is; only empty values
    refusal: Optional[str] = None
    function_call: None = None
    audio: None = None
    annotations: Optional[List[Any]] = None

    @model_validator(mode="after")
    def _shape(self) -> "ChatMessage":
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError("content is required (it may be null only in an assistant message with tool_calls)")
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        if (self.role == "tool") != (self.tool_call_id is not None):
            raise ValueError("a tool message needs tool_call_id, and only a tool message has one")
        if self.refusal or self.annotations:
            raise ValueError("refusal and annotations cannot be sent back to the model")
        for i, part in enumerate(self.content if isinstance(self.content, list) else []):
            kind = part.get("type")
            if kind != "text":
                raise Unsupported(f"content.{i}.type", f"{quote(kind)} parts are not supported: this server's models "
                                                       "read text only")
            if not isinstance(part.get("text"), str) or set(part) != {"type", "text"}:
                raise Unsupported(f"content.{i}", "a text part is {\"type\": \"text\", \"text\": \"...\"}")
        return self

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part["text"] for part in self.content)

    def for_template(self) -> Dict[str, Any]:
        """The message as Hugging Face chat templates take it (tool-call arguments as objects)."""
        out: Dict[str, Any] = {"role": "system" if self.role == "developer" else self.role, "content": self.text()}
        if self.tool_calls:
            calls = []
            for c in self.tool_calls:
                args = json.loads(c.function.arguments)  # checked by ToolCallFunction
                calls.append({"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": args}})
            out["tool_calls"] = calls
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


class ChatCompletionRequest(_Common):
    messages: List[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Optional[int] = Field(None, ge=1, le=I32_MAX)
    logprobs: bool = False
    top_logprobs: Optional[int] = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    response_format: Optional[ResponseFormat] = None
    tools: Optional[List[Tool]] = None
    tool_choice: Optional[Union[str, Dict[str, Any]]] = None
    parallel_tool_calls: Optional[bool] = None  # only means something with tools
    # declared so that the refusal names them (OpenAI features this server does not have)
    functions: Optional[List[Dict[str, Any]]] = None
    function_call: Optional[Union[str, Dict[str, Any]]] = None
    modalities: Optional[List[str]] = None
    audio: Optional[Dict[str, Any]] = None
    prediction: Optional[Dict[str, Any]] = None
    reasoning_effort: Optional[str] = None
    web_search_options: Optional[Dict[str, Any]] = None
    store: Optional[bool] = None
    metadata: Optional[Dict[str, str]] = None
    service_tier: Optional[str] = None

    @model_validator(mode="after")
    def _supported(self) -> "ChatCompletionRequest":
        if self.tool_choice not in (None, "none", "auto"):
            raise Unsupported("tool_choice", f"{quote(self.tool_choice)} is not supported: only 'auto' (the model "
                                             "decides) and 'none'; this server cannot force a tool call")
        if self.tool_choice == "auto" and not self.tools:
            raise Unsupported("tool_choice", "'auto' needs tools to choose from")
        if self.tools and len({t.function.name for t in self.tools}) < len(self.tools):
            raise Unsupported("tools", "two tools have the same name")
        if self.offers_tools() and self.stream:
            raise Unsupported("stream", "streaming with tools is not supported (a tool call is known only once "
                                        "complete): send stream false, or no tools")
        if self.parallel_tool_calls is False and self.offers_tools():
            raise Unsupported("parallel_tool_calls", "false is not supported: the model may call several tools in one "
                                                     "reply")
        if self.functions or self.function_call not in (None, "none"):
            raise Unsupported("functions" if self.functions else "function_call", "function calling is not supported")
        if self.modalities not in (None, ["text"]):
            raise Unsupported("modalities", "only ['text'] is supported")
        for name in ("audio", "prediction", "reasoning_effort", "web_search_options", "metadata"):
            if getattr(self, name) is not None:
                raise Unsupported(name, "not supported by this server")
        if self.store:
            raise Unsupported("store", "this server does not store completions")
        if self.service_tier not in (None, "auto", "default"):
            raise Unsupported("service_tier", "this server has one tier: 'auto' or 'default'")
        if self.top_logprobs is not None and not self.logprobs:
            raise Unsupported("top_logprobs", "needs logprobs set to true")
        return self

    def limit(self) -> Optional[int]:
        return self.max_completion_tokens or self.max_tokens

    def num_logprobs(self) -> int:
        return (self.top_logprobs or 0) if self.logprobs else -1

    def json_mode(self) -> Tuple[str, str]:
        fmt = self.response_format
        if fmt is None or fmt.type == "text":
            return "off", ""
        if fmt.type == "json_object":
            return "object", ""
        return "schema", json.dumps(fmt.json_schema.schema_)

    def offers_tools(self) -> bool:
        """True when the model is offered tools (tool_choice 'none' offers none)."""
        return bool(self.tools) and self.tool_choice != "none"

    def template_prompt(self) -> Union[List[Dict[str, Any]], Dict[str, Any]]:
        """What the tokenizer worker renders: the messages, with the tools when they are offered."""
        messages = [m.for_template() for m in self.messages]
        if not self.offers_tools():
            return messages
        return {"messages": messages, "tools": [t.model_dump(exclude_none=True) for t in self.tools]}
