"""Tool calls in a model's answer, in OpenAI's shape.

The tokenizer worker offers the tools only through a chat template that asks for the Hermes
format (`tokenize.check_renders_tools`), the one Qwen2.5, Qwen3 and Hermes templates teach: each
call a JSON object `{"name": ..., "arguments": {...}}` between `<tool_call>` and `</tool_call>`.

Parsing is all or nothing: if every `<tool_call>` block holds a well-formed call, the blocks
become `tool_calls` and the rest of the text the message's content; if any block is not valid
(cut by max_tokens, broken JSON, no name), the whole text stays the content and no call is
reported, since a half-understood call is worse than none.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from minisgl.tokenizer.tokenize import TOOL_CALL_CLOSE, TOOL_CALL_OPEN

_BLOCK = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)" + re.escape(TOOL_CALL_CLOSE), re.DOTALL)


@dataclass
class ParsedReply:
    content: Optional[str]  # None when the reply is nothing but tool calls
    tool_calls: List[Dict[str, Any]]  # OpenAI's shape: id, type "function", function {name, arguments (JSON text)}


def _call(block: str) -> Optional[Dict[str, Any]]:
    try:
        obj = json.loads(block)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models write the arguments as JSON text already
        try:
            json.loads(args)
        except json.JSONDecodeError:
            return None
        text = args
    elif isinstance(args, dict):
        text = json.dumps(args, ensure_ascii=False)
    else:
        return None
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": obj["name"], "arguments": text}}


def parse_tool_calls(text: str) -> ParsedReply:
    """Split a model's reply into content and tool calls (see the module docstring)."""
    blocks = _BLOCK.findall(text)
    if not blocks:
        return ParsedReply(text, [])
    calls = [_call(b.strip()) for b in blocks]
    rest = _BLOCK.sub("", text)
    if any(c is None for c in calls) or TOOL_CALL_OPEN in rest or TOOL_CALL_CLOSE in rest:
        return ParsedReply(text, [])
    content = rest.strip()
    return ParsedReply(content or None, calls)
