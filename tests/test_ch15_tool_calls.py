"""Chapter 15, tools offered to the model.

Claims: the model's `<tool_call>` blocks become OpenAI `tool_calls` (id, type "function", name,
arguments as JSON text) and the rest of the text the content, all or nothing; only a template that
reads `tools` and asks for `<tool_call>` blocks is offered tools, and the bundled SmolLM2 template
is refused with a 400 that says so; forcing a call and streaming with tools are refused by name;
end to end, with the openai client, the tools reach the template (the prompt is exactly what
transformers renders with them) and `tool_choice` "none" leaves them out.
"""

from __future__ import annotations

import json
import shutil

import openai
import pytest
from transformers import AutoTokenizer

from minisgl.core import InvalidRequestError
from minisgl.server.tool_calls import parse_tool_calls
from minisgl.tokenizer.tokenize import TokenizeManager, check_renders_tools
from server_utils import REPO_ROOT, ServerProcess, openai_client, post

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city now.",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}

# A template in the Hermes style (written for these tests): the tools as JSON lines in the system
# turn, calls asked for as <tool_call> blocks, and past calls written back the same way.
HERMES_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "You may call these functions, given as JSON signatures:\n<tools>\n"
    "{% for t in tools %}{{ t | tojson }}\n{% endfor %}</tools>\n"
    'To call one, reply with <tool_call>{"name": <name>, "arguments": <object>}</tool_call>.<|im_end|>\n'
    "{% endif %}"
    "{%- for m in messages %}{% if not (tools and loop.first and m.role == 'system') %}<|im_start|>{{ m.role }}\n{{ m.content or '' }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}</tool_call>{% endfor %}"
    "<|im_end|>\n{% endif %}{% endfor %}<|im_start|>assistant\n"
)


# ---- the parser, on model text we know ------------------------------------------------------------


def test_calls_are_cut_out_of_the_text_in_openai_shape():
    text = 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    got = parse_tool_calls(text)
    assert got.content == "Let me look."
    assert [c["function"]["name"] for c in got.tool_calls] == ["get_weather", "get_time"]
    assert [json.loads(c["function"]["arguments"]) for c in got.tool_calls] == [{"city": "Paris"}, {}]
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in got.tool_calls)
    assert len({c["id"] for c in got.tool_calls}) == 2
    only = parse_tool_calls('<tool_call>{"name": "get_time", "arguments": "{\\"tz\\": \\"UTC\\"}"}</tool_call>')
    assert only.content is None and json.loads(only.tool_calls[0]["function"]["arguments"]) == {"tz": "UTC"}  # arguments given as JSON text


@pytest.mark.parametrize("text", [
    "The weather is fine.",
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Par',  # cut by max_tokens
    '<tool_call>{"name": "get_weather", "arguments": {"city": Paris}}</tool_call>',  # not JSON
    '<tool_call>{"arguments": {}}</tool_call>',  # no name
    '<tool_call>{"name": "get_time", "arguments": {}}</tool_call> and <tool_call>{"name": "get_ti',  # one good, one cut
    '<tool_call>{"name": "get_time", "arguments": "not json"}</tool_call>',
], ids=["plain", "cut", "bad-json", "no-name", "one-cut", "bad-arguments"])
def test_anything_short_of_well_formed_calls_stays_text(text):
    got = parse_tool_calls(text)
    assert got.content == text and got.tool_calls == []


# ---- which templates can offer tools -------------------------------------------------------------------


def test_only_templates_that_render_tools_as_tool_call_blocks_are_offered_tools():
    tok = AutoTokenizer.from_pretrained(REPO_ROOT / "models/smollm2-135m-instruct")
    with pytest.raises(InvalidRequestError, match="does not render tools"):
        check_renders_tools(tok)
    tok.chat_template = "{% for t in tools or [] %}{{ t.function.name }}{% endfor %}{% for m in messages %}{{ m.content }}{% endfor %}"
    with pytest.raises(InvalidRequestError, match="<tool_call>"):
        check_renders_tools(tok)
    tok.chat_template = HERMES_TEMPLATE
    check_renders_tools(tok)
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    text = TokenizeManager(tok).render_chat(messages, [WEATHER])
    assert text == tok.apply_chat_template(messages, tools=[WEATHER], add_generation_prompt=True, tokenize=False)
    assert json.dumps(WEATHER) in text and "<tool_call>" in text


# ---- through the server ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hermes_model(tmp_path_factory):
    """tiny-qwen2 with the Hermes-style template in place of SmolLM2's."""
    src, dst = REPO_ROOT / "models/tiny-qwen2", tmp_path_factory.mktemp("models") / "tiny-qwen2-tools"
    dst.mkdir()
    for f in src.iterdir():
        if f.name == "model.safetensors":
            (dst / f.name).symlink_to(f.resolve())
        elif f.name not in ("chat_template.jinja", "tokenizer_config.json"):
            shutil.copy(f, dst / f.name)
    config = json.loads((src / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (dst / "tokenizer_config.json").write_text(json.dumps(config))
    (dst / "chat_template.jinja").write_text(HERMES_TEMPLATE)
    return dst


@pytest.fixture(scope="module")
def server(hermes_model):
    s = ServerProcess(str(hermes_model))
    yield s
    s.stop()


def test_tools_reach_the_template_and_the_reply_has_the_openai_shape(server, hermes_model):
    client = openai_client(server)
    tok = AutoTokenizer.from_pretrained(hermes_model)
    assert tok.chat_template == HERMES_TEMPLATE
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = client.chat.completions.create(model="tiny-qwen2-tools", messages=messages, tools=[WEATHER, TIME], tool_choice="auto", max_tokens=4)
    with_tools = tok.apply_chat_template(messages, tools=[WEATHER, TIME], add_generation_prompt=True, tokenize=True, return_dict=False)
    assert r.usage.prompt_tokens == len(with_tools)
    # a random tiny model writes no call: its text is the content, and nothing is invented
    choice = r.choices[0]
    assert choice.finish_reason == "length" and choice.message.tool_calls is None and isinstance(choice.message.content, str)
    assert parse_tool_calls(choice.message.content).tool_calls == []

    r = client.chat.completions.create(model="tiny-qwen2-tools", messages=messages, tools=[WEATHER], tool_choice="none", max_tokens=2)
    assert r.usage.prompt_tokens == len(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))


CHAT = {"model": "tiny-qwen2-tools", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "tools": [WEATHER]}


@pytest.mark.parametrize("body,param", [
    ({**CHAT, "tool_choice": "required"}, "tool_choice"),
    ({**CHAT, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}, "tool_choice"),
    ({**CHAT, "stream": True}, "stream"),
    ({**CHAT, "parallel_tool_calls": False}, "parallel_tool_calls"),
    ({**CHAT, "tools": [WEATHER, WEATHER]}, "tools"),
    ({**CHAT, "tools": [{"type": "function", "function": {**WEATHER["function"], "strict": True}}]}, "tools.0.function.strict"),
    ({**CHAT, "tools": [{"type": "code_interpreter"}]}, "tools.0.type"),
], ids=["required", "named", "stream", "parallel-false", "twice", "strict", "not-a-function"])
def test_what_the_server_cannot_do_with_tools_is_refused_by_name(server, body, param):
    r = post(server, body, "/v1/chat/completions")
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()


def test_a_request_without_tools_gets_a_plain_message(server):
    r = post(server, {k: v for k, v in CHAT.items() if k != "tools"}, "/v1/chat/completions")
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["tool_calls"] is None
