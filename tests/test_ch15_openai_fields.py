"""Chapter 15: every OpenAI request field is honoured or refused by name, over real HTTP: the
sampler's fields, several choices, several prompts, echo, tool conversations, refusals, errors,
metrics. (Log-probabilities and 64-bit seeds: test_ch15_logprobs.py.)

Oracles: the offline `LLM` with the same `SamplingParams` (the sampler's own tests, chapter 6,
check those against transformers' logits processors), and the chat template rendered by
transformers. One tiny-llama server serves the whole module.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from transformers import AutoTokenizer

from minisgl.core import SamplingParams
from minisgl.message import DetokenizeMsg, TokenizeMsg
from minisgl.server.protocol import choice_seed
from minisgl.tokenizer.tokenize import TokenizeManager
from minisgl.tokenizer.worker import TokenizerWorker
from server_utils import REPO_ROOT, client_fixture, llm_fixture, post, server_fixture

TINY = "models/tiny-llama"
NAME = "tiny-llama"
PROMPT = "The quick brown fox jumps over the lazy dog, and then"
LIMIT = 64 * 1024  # --max-request-bytes of the module's server


server = server_fixture(TINY, "--max-request-bytes", str(LIMIT))
llm = llm_fixture(TINY)
client = client_fixture()


def offline(llm, prompt, **params):
    return llm.generate([prompt], SamplingParams(**params))[0]


# ---- sampler fields reach the engine -----------------------------------------------------------


@pytest.mark.parametrize(
    "fields",
    [
        {"presence_penalty": 1.5},
        {"frequency_penalty": 2.0},
        {"repetition_penalty": 1.8},
        {"logit_bias": {"11": -100}},  # "," (and whatever the model writes) never comes out
        {"min_p": 0.2, "temperature": 1.0, "seed": 12},
        {"min_tokens": 12, "stop_token_ids": [13]},
        {"seed": 2**64 - 1, "temperature": 1.0},
    ],
    ids=lambda f: ",".join(f),
)
def test_sampler_fields_give_the_offline_engines_tokens(server, llm, fields):
    body = {"model": NAME, "prompt": PROMPT, "max_tokens": 12, "temperature": 0, **fields}
    r = post(server, body)
    assert r.status_code == 200, r.text
    params = {k: v for k, v in body.items() if k not in ("model", "prompt", "logit_bias", "stop_token_ids")}
    if "logit_bias" in fields:
        params["logit_bias"] = tuple((int(k), float(v)) for k, v in fields["logit_bias"].items())
    if "stop_token_ids" in fields:
        params["stop_token_ids"] = tuple(fields["stop_token_ids"])
    ref = offline(llm, PROMPT, **params)
    assert r.json()["choices"][0]["text"] == ref.text
    if "logit_bias" in fields:
        assert 11 not in ref.token_ids


# ---- several choices, several prompts, echo -------------------------------------------------------


def test_n_choices_are_seeded_per_choice_and_share_the_prompt(server, llm):
    prompt = PROMPT + " a unique prompt for the prefix-cache count"
    n_prompt = len(llm.encode(prompt))
    hits_before = server.health()["prefix_hit_tokens"]
    body = {"model": NAME, "prompt": prompt, "max_tokens": 6, "temperature": 1.0, "seed": 99, "n": 4}
    got = post(server, body).json()
    assert [c["index"] for c in got["choices"]] == [0, 1, 2, 3]
    refs = [offline(llm, prompt, max_tokens=6, temperature=1.0, seed=choice_seed(99, j)) for j in range(4)]
    assert [c["text"] for c in got["choices"]] == [r.text for r in refs]
    assert len({c["text"] for c in got["choices"]}) > 1  # different seeds, different samples
    assert got["usage"] == {"prompt_tokens": n_prompt, "completion_tokens": 24, "total_tokens": n_prompt + 24}
    # the prompt ran once: each of the four choices found all but its last token cached
    assert server.health()["prefix_hit_tokens"] - hits_before >= 4 * (n_prompt - 1)
    one = post(server, {**body, "n": 1}).json()
    assert one["choices"][0]["text"] == got["choices"][0]["text"]  # choice 0 keeps the seed


def test_list_prompts_echo_and_streamed_choices(server, llm):
    ids = llm.encode("Hello there, general")
    prompts = [llm.encode("Once upon a time"), ids]
    body = {"model": NAME, "prompt": prompts, "max_tokens": 5, "temperature": 0, "n": 2, "echo": True}
    got = post(server, body).json()
    refs = [offline(llm, p, max_tokens=5) for p in prompts]
    echoed = [llm.tokenizer.decode(p) for p in prompts]
    want = [echoed[i] + refs[i].text for i in range(2) for _ in range(2)]  # index = prompt * n + choice
    texts = post(server, {**body, "prompt": ["Once upon a time", "Hello there, general"], "n": 1}).json()
    assert [c["text"] for c in texts["choices"]] == [want[0], want[2]]
    assert [c["text"] for c in got["choices"]] == want
    assert got["usage"]["prompt_tokens"] == sum(len(r.prompt_ids) for r in refs)

    texts = {}
    with httpx.stream("POST", server.url + "/v1/completions", json={**body, "stream": True, "stream_options": {"include_usage": True}}, timeout=120) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ") and line != "data: [DONE]"]
    for e in events:
        for c in e["choices"]:
            texts[c["index"]] = texts.get(c["index"], "") + c["text"]
    assert [texts[i] for i in range(4)] == want
    assert events[-1]["usage"] == got["usage"]
    finals = [c for e in events for c in e["choices"] if c["finish_reason"]]
    assert sorted(c["index"] for c in finals) == [0, 1, 2, 3]


# ---- chat: tools, tool conversations, content parts --------------------------------------------


TOOL_CONVERSATION = [
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees and sunny"},
]


def test_tool_conversations_go_through_the_template_or_are_refused(server, client):
    # the bundled template renders a tool turn as a turn, but writes no tool calls: refused, by name
    with pytest.raises(openai.BadRequestError, match="chat template cannot render tool calls"):
        client.chat.completions.create(model=NAME, messages=TOOL_CONVERSATION, max_tokens=2)
    r = client.chat.completions.create(model=NAME, messages=[TOOL_CONVERSATION[0], {"role": "tool", "tool_call_id": "c", "content": "18 degrees"}], max_tokens=2)
    assert r.choices[0].finish_reason == "length"
    # nor does it render tools: offering them is refused (test_ch15_tool_calls has a template that does)
    with pytest.raises(openai.BadRequestError, match="chat template does not render tools"):
        client.chat.completions.create(model=NAME, messages=TOOL_CONVERSATION[:1], max_tokens=2, tools=[{"type": "function", "function": {"name": "get_weather", "parameters": {}}}])


def test_a_template_that_knows_tool_calls_renders_them():
    tok = AutoTokenizer.from_pretrained(REPO_ROOT / TINY)
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
        "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function.name }} {{ c.function.arguments | tojson }}</tool_call>{% endfor %}"
        "<|im_end|>\n{% endfor %}<|im_start|>assistant\n"
    )
    from minisgl.server.chat import ChatCompletionRequest

    messages = ChatCompletionRequest(model=NAME, messages=TOOL_CONVERSATION).template_prompt()
    text = TokenizeManager(tok).render_chat(messages)
    assert '<tool_call>get_weather {"city": "Paris"}</tool_call>' in text and "18 degrees and sunny" in text
    assert TokenizeManager(tok).encode(messages, chat=True) == tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)


# ---- refusals and errors: always OpenAI's error object ---------------------------------------------

OK = {"model": NAME, "prompt": "hi", "max_tokens": 2}
CHAT = {"model": NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
REFUSED = [
    ({**OK, "foo": 1}, "foo"),
    ({**OK, "max_tokens": "5"}, "max_tokens"),  # types are strict
    ({**OK, "seed": 2**64}, "seed"),
    ({**OK, "seed": -1}, "seed"),
    ({**OK, "max_tokens": 2**64}, "max_tokens"),
    ({**OK, "top_k": 2**70}, "top_k"),
    ({**OK, "logprobs": 6}, "logprobs"),
    ({**OK, "suffix": "!"}, "suffix"),
    ({**OK, "best_of": 3}, "best_of"),
    ({**OK, "echo": True, "logprobs": 1}, "echo"),
    ({**OK, "n": 129}, "n"),
    ({**OK, "prompt": []}, "prompt"),
    ({**OK, "stream_options": {"include_usage": True}}, "stream_options"),
    ({**OK, "logit_bias": {"comma": 1}}, "logit_bias"),
    ({**OK, "logit_bias": {"11": 101}}, "logit_bias"),
    ({**OK, "min_tokens": 3}, "min_tokens"),
    ({**OK, "logit_bias": {"999999": 1}}, None),  # outside the vocabulary: the tokenizer worker says so
    ({**OK, "stop_token_ids": [999999]}, None),
    ({**CHAT, "messages": [{"role": "user", "content": "hi", "name": "bob"}]}, "messages.0.name"),
    ({**CHAT, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "messages.0.content.0.type"),
    ({**CHAT, "messages": [{"role": "user", "content": None}]}, "messages.0"),
    ({**CHAT, "tool_choice": "auto"}, "tool_choice"),
    ({**CHAT, "functions": [{"name": "f"}]}, "functions"),
    ({**CHAT, "audio": {"voice": "x"}}, "audio"),
    ({**CHAT, "modalities": ["text", "audio"]}, "modalities"),
    ({**CHAT, "store": True}, "store"),
    ({**CHAT, "top_logprobs": 2}, "top_logprobs"),
    ({**CHAT, "top_logprobs": 21, "logprobs": True}, "top_logprobs"),
    ({**CHAT, "response_format": {"type": "json_schema"}}, "response_format"),
]


@pytest.mark.parametrize("body,param", REFUSED, ids=[f"{i}:{p}" for i, (_, p) in enumerate(REFUSED)])
def test_refused_fields_get_a_400_that_names_them(server, body, param):
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    r = post(server, body, path)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and set(err) == {"message", "type", "param", "code"}
    if param is not None:
        assert err["param"] == param and err["message"].startswith(param), err
    else:
        assert "999999" in err["message"] and "vocabulary" in err["message"]


def test_transport_errors_use_the_openai_error_object(server):
    def err(r, status):
        assert r.status_code == status, r.text
        body = r.json()
        assert set(body) == {"error"} and body["error"]["message"], body
        return body["error"]["message"]

    assert "/v2/nothing" in err(httpx.get(server.url + "/v2/nothing"), 404)
    assert "DELETE" in err(httpx.delete(server.url + "/v1/completions"), 405)
    assert "JSON" in err(httpx.post(server.url + "/v1/completions", content=b'{"model": ', headers={"content-type": "application/json"}), 400)
    surrogate = b'{"model": "tiny-llama", "messages": [{"role": "user", "content": "a\\ud800b"}]}'
    assert "Unicode" in err(httpx.post(server.url + "/v1/chat/completions", content=surrogate, headers={"content-type": "application/json"}), 400)
    big = {**OK, "prompt": "word " * (LIMIT // 4)}
    assert str(LIMIT) in err(httpx.post(server.url + "/v1/completions", json=big, timeout=60), 413)
    assert "gpt-9" in err(httpx.get(server.url + "/v1/models/gpt-9"), 404)
    assert post(server, OK).status_code == 200  # and the server still serves


def test_models_route_and_metrics(server, client):
    assert client.models.retrieve(NAME).id == NAME
    before = _metrics(server)
    r = post(server, {**OK, "max_tokens": 7, "ignore_eos": True})
    assert r.status_code == 200
    after = _metrics(server)
    assert after["minisgl_generation_tokens_total"] - before["minisgl_generation_tokens_total"] == 7
    assert after["minisgl_prompt_tokens_total"] - before["minisgl_prompt_tokens_total"] == r.json()["usage"]["prompt_tokens"]
    assert after["minisgl_time_to_first_token_seconds_count"] - before["minisgl_time_to_first_token_seconds_count"] == 1
    assert after["minisgl_time_per_output_token_seconds_count"] - before["minisgl_time_per_output_token_seconds_count"] == 1
    assert after[("minisgl_requests_total", "/v1/completions", "200")] - before[("minisgl_requests_total", "/v1/completions", "200")] == 1
    assert after["minisgl_queue_length"] == after["minisgl_running_requests"] == after["minisgl_kv_pages_used"] == 0
    assert after["minisgl_kv_pages_total"] > 0 and "minisgl_prefix_cache_hit_tokens_total" in after


def _metrics(server) -> dict:
    r = httpx.get(server.url + "/metrics", timeout=60)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            key = (s.name, s.labels["route"], s.labels["code"]) if "route" in s.labels else s.name
            out[key] = s.value
    out.setdefault(("minisgl_requests_total", "/v1/completions", "200"), 0)
    return out


# ---- the tokenizer worker's side of logprobs and echo, without processes -----------------------------


class _Outbox(list):
    def put(self, msg):
        self.append(msg)


def test_worker_names_logprob_tokens_and_puts_the_echo_first():
    tok = AutoTokenizer.from_pretrained(REPO_ROOT / TINY)
    worker = TokenizerWorker(tok, 2048, _Outbox(), _Outbox())
    ids = tok.encode("你好 there", add_special_tokens=False)
    worker.on_api_msg(TokenizeMsg(0, "Hi", False, SamplingParams(max_tokens=len(ids), logprobs=1), echo=True))
    replies = []
    for i, t in enumerate(ids):
        last = i == len(ids) - 1
        replies += worker.on_scheduler_msg(DetokenizeMsg(0, t, "length" if last else None, -0.5 - i, ((t, -0.5 - i), (7, -3.0))))
    assert replies[0].text.startswith("Hi") and "".join(r.text for r in replies) == "Hi" + tok.decode(ids)
    entries = [e for r in replies for e in r.logprobs]
    assert [r for rep in replies for r in rep.token_ids] == ids and len(entries) == len(ids)
    assert b"".join(bytes(e.bytes) for e in entries).decode() == tok.decode(ids)  # bytes exact, even split characters
    assert entries[0].token.startswith("bytes:") and entries[0].logprob == -0.5
    assert [(a.token, a.logprob) for a in entries[1].top] == [(entries[1].token, -1.5), (tok.decode([7]), -3.0)]
