"""Chapter 15: serving under hostile input. A client that hangs up has its request aborted at
once; a JSON schema compiles beside the scheduler's loop, within a size and a time limit, while
the other streams keep their pace; a body nested any number of levels deep is a 400, never a
500, and leaves nothing open (a SIGTERM then exits at once); error messages quote the client's
text only briefly; token ids are ASCII digits.

One tiny-llama server for the module, with small limits so that each is reached cheaply; the last
test stops it.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import signal
import socket
import time
from typing import Any, List

import httpx
import pytest
import torch

from minisgl.engine.sample import hashed_uniform
from minisgl.models.config import ModelConfig
from minisgl.server.errors import MAX_DEPTH, json_depth
from minisgl.utils.tokenizer import load_tokenizer
from server_utils import assert_all_free, post, server_fixture

TINY = "models/tiny-llama"
GRAMMAR_TIMEOUT_S = 3.0
MAX_SCHEMA_BYTES = 4096
server = server_fixture(TINY, "--grammar-timeout", str(GRAMMAR_TIMEOUT_S), "--max-schema-bytes", str(MAX_SCHEMA_BYTES), "--drain-timeout", "20")

CHAT = "/v1/chat/completions"
LONG = {"model": "tiny-llama", "prompt": "Tell me everything.", "max_tokens": 1900, "ignore_eos": True, "temperature": 0}
# nested repetitions: a pattern xgrammar takes seconds to compile (each letter its own grammar)
SLOW_SCHEMA = {"type": "object", "properties": {c: {"type": "string", "pattern": f"(({c}{{1,50}}){{1,50}}){{1,20}}"} for c in "abcdefgh"}}


def chat_body(**fields: Any) -> dict:
    return {"model": "tiny-llama", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, **fields}


def schema_format(schema: Any) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}


def assert_openai_error(r: httpx.Response, status: int) -> str:
    assert r.status_code == status, r.text[:500]
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and isinstance(err["message"], str), err
    return err["message"]


# ---- nesting ----------------------------------------------------------------------------------


def nested_text(depth: int, inner: str = '"x"') -> str:
    """`depth` levels of {"a": ...} around `inner`, as JSON text (json.dumps itself would recurse)."""
    return '{"a": ' * depth + inner + "}" * depth


def test_json_depth_matches_a_recursive_count():
    def depth(v: Any) -> int:
        if isinstance(v, dict):
            return 1 + max(map(depth, v.values()), default=0)
        if isinstance(v, list):
            return 1 + max(map(depth, v), default=0)
        return 0

    rng = random.Random(0)
    tricky = ['[{"', '\\', '"]}\\', '\\"[', "é{", "x"]  # brackets, quotes and backslashes inside strings

    def value(level: int) -> Any:
        r = rng.random()
        if level > 8 or r < 0.3:
            return rng.choice([*tricky, 1, None, True])
        if r < 0.65:
            return [value(level + 1) for _ in range(rng.randint(0, 3))]
        return {rng.choice(tricky) + str(i): value(level + 1) for i in range(rng.randint(0, 3))}

    for _ in range(2000):
        v = value(0)
        text = json.dumps(v, ensure_ascii=rng.random() < 0.5)
        assert json_depth(text.encode()) == depth(v), text
    assert json_depth(nested_text(50000).encode()) == 50000


@pytest.mark.parametrize("depth", [1000, 5000, 50000])
def test_any_nesting_depth_is_a_400_wherever_it_is(server, depth):
    deep = nested_text(depth)
    tool = '{"type": "function", "function": {"name": "f", "parameters": ' + deep + "}}"
    base = '{"model": "tiny-llama", "max_tokens": 4, '
    hi = '"messages": [{"role": "user", "content": "Hi"}]'
    bodies = {
        "tools[].parameters": base + hi + ', "tools": [' + tool + "]}",
        "response_format.json_schema.schema": base + hi + ', "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": ' + deep + "}}}",
        "a content part": base + '"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi", "extra": ' + deep + "}]}]}",
    }
    for where, body in bodies.items():
        r = httpx.post(server.url + CHAT, content=body, headers={"content-type": "application/json"}, timeout=60)
        message = assert_openai_error(r, 400)
        assert f"at most {MAX_DEPTH}" in message, (where, message)
    assert post(server, chat_body(), CHAT).status_code == 200  # and the server serves on


def test_nesting_within_the_limit_is_served(server):
    tool = {"type": "function", "function": {"name": "f", "parameters": json.loads(nested_text(MAX_DEPTH // 2 - 4))}}
    r = post(server, chat_body(tools=[tool], tool_choice="none"), CHAT)
    assert r.status_code == 200, r.text[:500]


# ---- what error messages quote ------------------------------------------------------------------


def test_error_messages_quote_the_client_briefly(server):
    huge = "m" * 1_000_000
    for r in (post(server, {"model": huge, "prompt": "Hi"}), httpx.get(server.url + "/v1/models/" + "m" * 5000, timeout=60)):
        message = assert_openai_error(r, 404)
        assert len(message) < 200 and "mmm" in message and "characters" in message, message
    r = post(server, chat_body(tool_choice="x" * 100_000), CHAT)
    assert len(assert_openai_error(r, 400)) < 300


def test_logit_bias_keys_are_ascii_digits(server):
    for key in ("\u0661\u0662", "\uff11\uff12", "12 ", "-1", "1" * 40):  # Arabic-Indic and fullwidth "12"
        message = assert_openai_error(post(server, {**LONG, "max_tokens": 2, "logit_bias": {key: 5}}), 400)
        assert "ASCII digits" in message
    assert post(server, {**LONG, "max_tokens": 2, "logit_bias": {"12": 5}}).status_code == 200


# ---- a client that hangs up --------------------------------------------------------------------


def counts(server) -> dict:
    """The scheduler's current counts (a busy scheduler's /health gives its last ones: ask again)."""
    for _ in range(100):
        h = server.health()  # waits up to 2 s for the scheduler's answer
        if h["status"] == "ok":
            return h
    raise AssertionError(f"the scheduler stayed busy: {h}")


def wait_for(condition, timeout_s: float, step_s: float = 0.05) -> float:
    """Seconds until `condition()` held (polled); AssertionError past `timeout_s`."""
    t0 = time.monotonic()
    while not condition():
        assert time.monotonic() - t0 < timeout_s, f"not within {timeout_s} s"
        time.sleep(step_s)
    return time.monotonic() - t0


def hang_up_after(server, path: str, body: dict, wait_s: float) -> None:
    """Send a request and give up on it after `wait_s` seconds, as a client with a timeout does."""
    with pytest.raises(httpx.ReadTimeout):
        with httpx.stream("POST", server.url + path, json=body, timeout=httpx.Timeout(30, read=wait_s)) as r:
            for _ in r.iter_bytes():
                pass


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_hangs_up_is_aborted_at_once(server, stream):
    before = counts(server)["aborted_requests"]
    # a chat that would run for many seconds; a streaming client stops reading after its first event
    long_chat = chat_body(max_tokens=1900, ignore_eos=True, temperature=0, stream=stream)
    if stream:
        with httpx.stream("POST", server.url + CHAT, json=long_chat, timeout=30) as r:
            lines = r.iter_lines()  # kept: a dropped iterator would close the response at once
            next(lines)
            wait_for(lambda: counts(server)["running_requests"] == 1, 10)
    else:
        hang_up_after(server, CHAT, long_chat, 1.5)
    took = wait_for(lambda: counts(server)["live_requests"] == 0, 10)
    assert took < 3.0, f"the request ran on {took:.2f} s after its client hung up"
    assert counts(server)["aborted_requests"] == before + 1  # aborted, not finished
    assert_all_free(server)


# ---- JSON schemas: compiled beside the loop, within limits -------------------------------------


def test_a_schema_over_the_size_limit_is_refused_naming_the_limit(server):
    schema = {"type": "object", "description": "d" * MAX_SCHEMA_BYTES, "properties": {"a": {"type": "integer"}}}
    message = assert_openai_error(post(server, chat_body(response_format=schema_format(schema)), CHAT), 400)
    assert str(MAX_SCHEMA_BYTES) in message and "--max-schema-bytes" in message, message


async def _stream_arrivals(url: str, arrivals: List[float], started: asyncio.Event, stop: asyncio.Event) -> None:
    """Stream LONG, noting the time each event arrives, until `stop` is set (then hang up)."""
    async with httpx.AsyncClient(timeout=120) as client:
        async with client.stream("POST", url + "/v1/completions", json={**LONG, "stream": True}) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    arrivals.append(time.monotonic())
                    started.set()
                if stop.is_set():
                    return


async def _pace_while_compiling(url: str) -> tuple:
    arrivals: List[float] = []
    started, stop = asyncio.Event(), asyncio.Event()
    streaming = asyncio.ensure_future(_stream_arrivals(url, arrivals, started, stop))
    await asyncio.wait_for(started.wait(), 60)
    await asyncio.sleep(2.0)  # its usual pace
    submitted = time.monotonic()
    async with httpx.AsyncClient(timeout=120) as client:
        refused = await client.post(url + CHAT, json=chat_body(response_format=schema_format(SLOW_SCHEMA)))
    answered = time.monotonic()
    stop.set()
    await asyncio.wait_for(streaming, 60)
    return arrivals, submitted, answered, refused


def longest_gap(times: List[float], start: float, end: float) -> float:
    inside = [t for t in times if start <= t <= end]
    return max((b - a for a, b in zip(inside, inside[1:])), default=float("inf"))


def test_a_compiling_schema_keeps_other_streams_at_pace_and_is_stopped_at_the_time_limit(server):
    warm = post(server, chat_body(response_format=schema_format({"type": "object", "properties": {"a": {"type": "integer"}}})), CHAT)
    assert warm.status_code == 200, warm.text  # the compiler's process is up: what follows is compiling only
    arrivals, submitted, answered, refused = asyncio.run(_pace_while_compiling(server.url))
    # its usual longest gap, measured just before (at least 0.25 s: a busy machine's scheduling
    # jitter); compiling on the loop would stall the stream for the whole compile, seconds
    usual = max(longest_gap(arrivals, arrivals[0] + 0.5, submitted), 0.25)
    during = longest_gap(arrivals, submitted, answered)
    assert during <= 2 * usual, f"a token took {during:.2f} s while the schema compiled; usually at most {usual:.2f} s"
    message = assert_openai_error(refused, 400)
    assert f"{GRAMMAR_TIMEOUT_S:g} s" in message and "--grammar-timeout" in message, message
    assert answered - submitted < GRAMMAR_TIMEOUT_S + 5, "the time limit did not stop the compile"
    assert_all_free(server)
    fine = post(server, chat_body(response_format=schema_format({"type": "object", "properties": {"b": {"type": "string"}}})), CHAT)
    assert fine.status_code == 200, fine.text  # a fresh compiler process replaces the stopped one


# ---- client mistakes are 4xx, whatever they are ----------------------------------------------


def longest_run(text: str, char: str) -> int:
    return max((len(m) for m in re.findall(f"{re.escape(char)}+", text)), default=0)


def test_client_mistakes_are_4xx_in_the_openai_shape(server):
    def called(arguments: str) -> dict:
        call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
        return chat_body(messages=[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": None,
                                                                        "tool_calls": [call]}])

    message = assert_openai_error(post(server, called("{not json"), CHAT), 400)
    assert "arguments" in message and "not JSON" in message, message
    message = assert_openai_error(post(server, called("[" * 5000 + "]" * 5000), CHAT), 400)
    assert f"at most {MAX_DEPTH}" in message, message  # nesting inside a string is nesting too
    for ids in ([2**64], [2**64 + 5, 1], [-(2**70)]):  # msgpack carries 64 bits; 2**63 was already a 400
        message = assert_openai_error(post(server, {"model": "tiny-llama", "prompt": ids, "max_tokens": 2}), 400)
        assert "vocabulary" in message, message
    # any JSON is a client's to send: keys that look like the wire format's tags, integers of any size
    r = post(server, called(json.dumps({"__dc__": 2**70, "__int__": "x"})), CHAT)
    assert 400 <= r.status_code < 500, r.text[:300]
    assert post(server, chat_body(), CHAT).status_code == 200


def test_a_client_gone_mid_body_is_no_500(server):
    def count(text: str, code: str) -> float:
        found = re.findall(rf'minisgl_requests_total\{{code="{code}",route="/v1/chat/completions"\}} ([0-9.]+)', text)
        return float(found[0]) if found else 0.0

    before = httpx.get(server.url + "/metrics", timeout=30).text
    for _ in range(5):
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 1000\r\n\r\n{\"model\": ")
            time.sleep(0.05)
    wait_for(lambda: count(httpx.get(server.url + "/metrics", timeout=30).text, "499") >= count(before, "499") + 5, 10)
    after = httpx.get(server.url + "/metrics", timeout=30).text
    assert count(after, "500") == count(before, "500"), "a client that hung up was counted as the server's failure"


def test_no_quote_over_40_characters_and_no_server_path(server):
    probes = {
        "a path": httpx.get(server.url + "/v1/" + "q" * 900, timeout=60),
        "a method": httpx.request("PATCH", server.url + "/v1/" + "q" * 900, timeout=60),
        "a schema": post(server, chat_body(response_format=schema_format({"type": "q" * 227})), CHAT),
        "a reference": post(server, chat_body(response_format=schema_format({"$ref": "#/q/" + "q" * 300})), CHAT),
    }
    for what, r in probes.items():
        assert 400 <= r.status_code < 500, (what, r.text[:300])
        message = r.json()["error"]["message"]
        assert longest_run(message, "q") <= 40, (what, message)
        assert not re.search(r"\.(cc|cpp|h|py):\d+|/project/|/work/", message), (what, message)


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-32-be"])
def test_a_body_in_an_encoding_the_depth_guard_does_not_read_is_refused(server, encoding):
    # "\u2200" is the bytes 00 22 or 22 00 in UTF-16 and UTF-32: a quote, to a counter of UTF-8 bytes
    body = chat_body(messages=[{"role": "user", "content": "Hi \u2200"}],
                     response_format=schema_format(json.loads(nested_text(MAX_DEPTH * 2))))
    r = httpx.post(server.url + CHAT, content=json.dumps(body, ensure_ascii=False).encode(encoding),
                   headers={"content-type": "application/json"}, timeout=60)
    message = assert_openai_error(r, 415)
    assert "UTF-8" in message, message
    small = json.dumps(chat_body()).encode("utf-8-sig")  # UTF-8, with a byte-order mark: read as it is
    assert httpx.post(server.url + CHAT, content=small, headers={"content-type": "application/json"},
                      timeout=60).status_code == 200


# ---- grammar lanes: a cached grammar never waits for a compile ------------------------------------


async def _timed_post(client: httpx.AsyncClient, url: str, body: dict) -> tuple:
    t0 = time.monotonic()
    r = await client.post(url + CHAT, json=body)
    return time.monotonic() - t0, r


async def _cached_during_compiles(url: str) -> tuple:
    slow_ones = [{**SLOW_SCHEMA, "title": f"slow {i}"} for i in range(3)]  # three distinct schemas
    async with httpx.AsyncClient(timeout=120) as client:
        compiling = [asyncio.ensure_future(_timed_post(client, url, chat_body(response_format=schema_format(s))))
                     for s in slow_ones]
        await asyncio.sleep(0.5)  # every lane is compiling, and one schema is queued
        cached = await _timed_post(client, url, chat_body(response_format={"type": "json_object"}))
        plain = await _timed_post(client, url, chat_body())
        return cached, plain, await asyncio.gather(*compiling)


def test_a_cached_grammar_never_waits_for_the_schemas_compiling(server):
    warm = post(server, chat_body(response_format={"type": "json_object"}), CHAT)
    assert warm.status_code == 200, warm.text
    (cached_s, cached), (plain_s, plain), slow = asyncio.run(_cached_during_compiles(server.url))
    assert cached.status_code == 200 and plain.status_code == 200, (cached.text, plain.text)
    assert cached_s <= 3 * max(plain_s, 0.25), f"a cached grammar took {cached_s:.2f} s, a plain chat {plain_s:.2f} s"
    for took, r in slow:  # each wait, queue included, ends at the time limit
        message = assert_openai_error(r, 400)
        assert "--grammar-timeout" in message, message
        assert took < 1.5 * GRAMMAR_TIMEOUT_S + plain_s, f"a schema was answered after {took:.1f} s"
    assert_all_free(server)


# ---- a draw at the top of the hash -----------------------------------------------------------------


# a seed whose random draws for the first token of `chat_body()` (position 31) reach the hash's top
# value, which float32 rounded to 1.0, at a token that cannot start a JSON object (found by search)
TOP_SEED = 1258


def test_a_json_chat_whose_draw_tops_the_hash_at_a_masked_token_stays_json(server):
    # the random draw of one masked token was exactly 1.0: its race term, 0 / -log(1), was NaN and
    # won, the grammar's next bitmask refused that token, and the scheduler ended
    step = post(server, chat_body(max_tokens=1), CHAT).json()["usage"]["prompt_tokens"]  # the first token's position
    u = hashed_uniform(torch.tensor([TOP_SEED]), torch.tensor([step]), ModelConfig.from_dir(TINY).vocab_size)[0]
    tops = [load_tokenizer(TINY).decode([t]) for t in (u >= 1 - 2**-24).nonzero().flatten().tolist()]
    assert any(t.strip() and not t.strip().startswith("{") for t in tops), f"TOP_SEED is stale: search again ({step}, {tops})"
    r = post(server, chat_body(seed=TOP_SEED, temperature=1.0, response_format={"type": "json_object"}), CHAT)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"].lstrip().startswith("{"), r.text
    assert_all_free(server)


# ---- last: nothing was left open -----------------------------------------------------------------


def test_sigterm_after_all_of_the_above_exits_at_once(server):
    r = httpx.post(server.url + CHAT, content=nested_text(3000), headers={"content-type": "application/json"}, timeout=60)
    assert_openai_error(r, 400)
    hang_up_after(server, "/v1/completions", LONG, 1.0)  # and one more client that hangs up
    wait_for(lambda: counts(server)["live_requests"] == 0, 10)
    t0 = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    server.proc.wait(30)
    assert time.monotonic() - t0 < 12, "the drain waited for a request nobody is waiting for (drain time 20 s)"
    assert server.proc.returncode == 0
