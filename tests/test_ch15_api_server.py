"""Chapter 15: the OpenAI-compatible server, end to end, with the real processes.

Oracle: the offline `LLM` (itself checked against transformers in chapter 7) on the same prompts,
greedy. Each test talks HTTP to a `python -m minisgl` server on a free port.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import sys
import threading
import time

import httpx
import openai
import pexpect
import pytest

from minisgl.core import SamplingParams
from minisgl.llm import LLM
from minisgl.server.api import RETRY_AFTER_S, create_app
from minisgl.server.args import ServerArgs
from minisgl.server.launch import Backend
from server_utils import (REPO_ROOT, ServerProcess, assert_all_free, child_pids, llm_fixture, pid_alive, server_fixture,
                          server_in_thread)

SMOL = "models/smollm2-135m-instruct"
TINY = "models/tiny-llama"


smol_server = server_fixture(SMOL)
tiny_server = server_fixture(TINY)


PROMPT, QUESTION, GREETING = "The capital of France is", "What is the capital of France?", "Say hi."


@pytest.fixture(scope="module")
def smol_refs():
    """Offline greedy references, computed once: completion and chat, 8 tokens; a short chat reply."""
    llm = LLM(REPO_ROOT / SMOL)
    text = llm.generate([PROMPT], SamplingParams(max_tokens=8))[0]
    chat, greeting = llm.generate([QUESTION, GREETING], [SamplingParams(max_tokens=8), SamplingParams(max_tokens=24)], chat=True)
    return text, chat, greeting


tiny_llm = llm_fixture(TINY)


# ---- the official client, compared with the offline engine ------------------------------------


def test_openai_client_matches_offline_llm(smol_server, smol_refs):
    client = openai.OpenAI(base_url=smol_server.url + "/v1", api_key="unused")
    name = client.models.list().data[0].id
    assert name == "smollm2-135m-instruct"
    prompt, question = PROMPT, QUESTION
    ref_text, ref_chat, _ = smol_refs

    comp = client.completions.create(model=name, prompt=prompt, max_tokens=8, temperature=0)
    assert comp.choices[0].text == ref_text.text
    assert comp.choices[0].finish_reason == ref_text.finish_reason == "length"
    assert (comp.usage.prompt_tokens, comp.usage.completion_tokens) == (len(ref_text.prompt_ids), 8)

    stream = client.completions.create(model=name, prompt=prompt, max_tokens=8, temperature=0, stream=True)
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks) == ref_text.text
    assert chunks[-1].choices[0].finish_reason == "length"

    chat = client.chat.completions.create(model=name, messages=[{"role": "user", "content": question}], max_tokens=8, temperature=0)
    assert chat.choices[0].message.content == ref_chat.text
    assert chat.choices[0].message.role == "assistant"
    assert chat.choices[0].finish_reason == ref_chat.finish_reason
    assert chat.usage.prompt_tokens == len(ref_chat.prompt_ids) and chat.usage.completion_tokens == 8

    stream = client.chat.completions.create(
        model=name, messages=[{"role": "user", "content": question}], max_tokens=8, temperature=0, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ref_chat.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == ref_chat.finish_reason
    assert chunks[-1].usage.total_tokens == len(ref_chat.prompt_ids) + 8


def test_stop_strings_and_eos_finish_reason(smol_server, smol_refs):
    client = openai.OpenAI(base_url=smol_server.url + "/v1", api_key="unused")
    prompt, full, ref = PROMPT, smol_refs[0].text, smol_refs[2]  # full: " Paris.\n\nThe answer..."
    stop = full[3:6]
    for stream in (False, True):
        resp = client.completions.create(model="smollm2-135m-instruct", prompt=prompt, max_tokens=8, temperature=0, stop=[stop, "never seen"], stream=stream)
        chunks = list(resp) if stream else [resp]
        text = "".join(c.choices[0].text for c in chunks)
        assert text == full[: full.index(stop)]
        assert chunks[-1].choices[0].finish_reason == "stop"
    # a chat reply that ends on its own finishes with "stop" and is shorter than the limit
    assert ref.finish_reason == "stop"
    resp = client.chat.completions.create(model="smollm2-135m-instruct", messages=[{"role": "user", "content": GREETING}], max_tokens=24, temperature=0)
    assert (resp.choices[0].finish_reason, resp.choices[0].message.content) == (ref.finish_reason, ref.text)
    assert_all_free(smol_server)


# ---- many clients at once ----------------------------------------------------------------------


def _workload(n: int, seed: int):
    rng = random.Random(seed)
    return [([rng.randrange(3, 49152) for _ in range(rng.randint(1, 40))], rng.randint(1, 16)) for _ in range(n)]


async def _stream(client: httpx.AsyncClient, url: str, prompt, max_tokens: int, leave_after: int | None = None):
    body = {"model": "tiny-llama", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    if leave_after is not None:
        body["ignore_eos"] = True
    text, reason, chunks = "", None, 0
    async with client.stream("POST", url + "/v1/completions", json=body) as resp:
        assert resp.status_code == 200, await resp.aread()
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[6:])["choices"][0]
            text += choice["text"]
            reason = choice["finish_reason"] or reason
            chunks += 1
            if leave_after is not None and chunks >= leave_after:
                return None  # closing the stream here disconnects the client
    return text, reason


async def _run_clients(url: str, jobs, leavers: set):
    limits = httpx.Limits(max_connections=128)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        tasks = [_stream(client, url, p, 1500 if i in leavers else m, 2 if i in leavers else None) for i, (p, m) in enumerate(jobs)]
        return await asyncio.gather(*tasks)


def _offline(llm: LLM, jobs):
    outs = llm.generate([p for p, _ in jobs], [SamplingParams(max_tokens=m) for _, m in jobs])
    return [(o.text, o.finish_reason) for o in outs]


def test_64_concurrent_streams_match_offline(tiny_server, tiny_llm):
    jobs = _workload(64, seed=1)
    got = asyncio.run(_run_clients(tiny_server.url, jobs, set()))
    assert got == _offline(tiny_llm, jobs)
    assert_all_free(tiny_server)


def test_clients_disconnecting_mid_stream_are_aborted(tiny_server, tiny_llm):
    jobs = _workload(64, seed=2)
    leavers = set(random.Random(3).sample(range(64), 16))
    aborted_before = tiny_server.health()["aborted_requests"]
    got = asyncio.run(_run_clients(tiny_server.url, jobs, leavers))
    ref = _offline(tiny_llm, jobs)
    for i in range(64):
        assert got[i] == (None if i in leavers else ref[i]), i
    # each leaver asked for 1500 tokens with EOS ignored: only an abort ends it early
    assert_all_free(tiny_server)
    assert tiny_server.health()["aborted_requests"] - aborted_before == 16


# ---- bad input -----------------------------------------------------------------------------------


def test_bad_requests_get_clear_errors_and_server_keeps_serving(tiny_server):
    url = tiny_server.url
    ok = {"model": "tiny-llama", "prompt": "hi", "max_tokens": 2}
    cases = [
        ({**ok, "prompt": [5] * 3000}, 400, ["3000", "2048"]),
        ({**ok, "prompt": [5] * 100, "max_tokens": 2000}, 400, ["100", "2000", "2048"]),
        ({**ok, "temperature": -1}, 400, ["temperature"]),
        ({**ok, "temperature": "hot"}, 400, ["temperature"]),
        ({**ok, "top_p": 0}, 400, ["top_p"]),
        ({**ok, "top_k": 0}, 400, ["top_k"]),
        ({**ok, "max_tokens": 0}, 400, ["max_tokens"]),
        ({**ok, "n": 1000}, 400, ["n"]),
        ({**ok, "prompt": [5, 10**9]}, 400, ["token id"]),
        ({k: v for k, v in ok.items() if k != "prompt"}, 400, ["prompt"]),
        ({**ok, "model": "gpt-9"}, 404, ["gpt-9", "tiny-llama"]),
    ]
    for body, status, words in cases:
        r = httpx.post(url + "/v1/completions", json=body, timeout=60)
        assert r.status_code == status, (body, r.text)
        msg = r.json()["error"]["message"]
        assert all(w in msg for w in words), (words, msg)
    r = httpx.post(url + "/v1/completions", content=b'{"model": "tiny-llama", "prompt": ', headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    r = httpx.post(url + "/v1/chat/completions", json={"model": "tiny-llama", "messages": [{"role": "robot", "content": "x"}]}, timeout=60)
    assert r.status_code == 400 and "messages.0.role" in r.json()["error"]["message"]
    r = httpx.post(url + "/v1/chat/completions", json={"model": "tiny-llama", "messages": [{"role": "user", "content": "x"}], "stream": True, "max_tokens": 5000}, timeout=60)
    assert r.status_code == 400 and "2048" in r.json()["error"]["message"]  # no half-open stream
    r = httpx.post(url + "/v1/completions", json=ok, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
    assert_all_free(tiny_server)


# ---- start-up: the port opens first, the engine follows ---------------------------------------


class HeldBackend(Backend):
    """The real engine processes, started only once the test lets go: a start-up as long as the
    test needs, as a GPU warm-up is, through the same `starting` steps the server drives."""

    def __init__(self, args: ServerArgs):
        super().__init__(args)
        self.go = threading.Event()

    def starting(self):
        self.waiting_for = "the test to let the start-up go"
        while not self.go.is_set():
            yield
        yield from super().starting()


def test_the_server_answers_starting_until_the_engine_is_ready(tiny_llm):
    ref = tiny_llm.generate(["Hello!"], SamplingParams(max_tokens=6), chat=True)[0].text
    chat = {"model": "tiny-llama", "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 6, "temperature": 0}
    backend = HeldBackend(ServerArgs.from_options(model_path=str(REPO_ROOT / TINY)))
    with server_in_thread(create_app(backend.args, backend)) as url:
        r = httpx.get(url + "/health", timeout=30)
        assert r.status_code == 503 and r.headers["retry-after"] == str(RETRY_AFTER_S), r.text
        assert r.json()["status"] == "starting" and r.json()["waiting_for"] == "the test to let the start-up go"
        for path, body in [("/v1/chat/completions", chat), ("/v1/chat/completions", {**chat, "stream": True}),
                           ("/v1/completions", {"model": "tiny-llama", "prompt": "Hi"}), ("/v1/models", None)]:
            r = httpx.request("POST" if body else "GET", url + path, json=body, timeout=30)
            assert r.status_code == 503 and r.headers["retry-after"] == str(RETRY_AFTER_S), (path, r.text)
            error = r.json()["error"]
            assert error["type"] == "service_unavailable" and error["code"] == "engine_starting", error
            assert "the engine is starting (waiting for the test to let the start-up go)" in error["message"], error
        assert 'code="503",route="/v1/chat/completions"} 2.0' in httpx.get(url + "/metrics", timeout=30).text
        assert not backend.procs, "a process started before the test let it"
        backend.go.set()
        deadline = time.monotonic() + 240
        while (r := httpx.get(url + "/health", timeout=30)).status_code == 503 and time.monotonic() < deadline:
            assert r.json()["status"] == "starting", r.text
            time.sleep(0.1)
        assert r.status_code == 200 and r.json()["status"] == "ok", r.text
        assert r.json()["prompt_tokens"] == 0  # the refused requests never reached the scheduler
        r = httpx.post(url + "/v1/chat/completions", json=chat, timeout=120)
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == ref, r.text
        kids = [p.pid for p in backend.procs]
    time.sleep(0.5)
    assert kids and not [p for p in kids if pid_alive(p)], "the server left processes behind"


# ---- the shell and shutdown -------------------------------------------------------------------


def test_shell_chats_under_a_pseudo_terminal(tiny_llm):
    ref = tiny_llm.generate(["Hello!"], SamplingParams(max_tokens=6), chat=True)[0].text
    cmd = f"{sys.executable} -m minisgl --shell --model {REPO_ROOT / TINY} --shell-max-tokens 6"
    child = pexpect.spawn(cmd, cwd=str(REPO_ROOT), encoding="utf-8", timeout=240)
    try:
        child.expect(r"minisgl: waiting for the scheduler to load tiny-llama onto \w+")  # what start-up waits for
        child.expect("minisgl shell")
        child.expect(r"\n> ")
        kids = child_pids(child.pid)
        assert len(kids) >= 2  # scheduler, tokenizer worker (and multiprocessing's resource tracker)
        child.sendline("Hello!")
        child.expect(r"\r\n> ")  # the reply, its newline, the next prompt
        echoed, reply = child.before.replace("\r\n", "\n").split("\n", 1)
        assert echoed == "Hello!" and reply == ref.replace("\r\n", "\n")
        child.sendline("/reset")
        child.expect("conversation cleared")
        child.sendeof()
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
    time.sleep(0.5)
    assert not [p for p in kids if pid_alive(p)], "shell left processes behind"


def test_shell_completes_plain_text_when_the_tokenizer_has_no_chat_template(tmp_path):
    """Random weights in a config-only folder: token i reads '<i>', and with no chat template to render
    a conversation the shell completes each line as it stands, as LLM.generate does with those ids."""
    (tmp_path / "config.json").write_text((REPO_ROOT / TINY / "config.json").read_text())
    ref = LLM(str(tmp_path), dummy_weights=True, device="cpu").generate([[5, 6]], SamplingParams(max_tokens=4))[0]
    cmd = f"{sys.executable} -m minisgl --shell --model {tmp_path} --dummy-weights --shell-max-tokens 4"
    child = pexpect.spawn(cmd, cwd=str(REPO_ROOT), encoding="utf-8", timeout=240)
    try:
        child.expect("no chat template: each line is completed as plain text")
        child.expect(r"\n> ")
        child.sendline("<5><6>")
        child.expect(r"\r\n> ")
        echoed, reply = child.before.replace("\r\n", "\n").split("\n", 1)
        assert echoed == "<5><6>" and reply == "".join(f"<{t}>" for t in ref.token_ids)
        child.sendeof()
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_shutdown_leaves_no_processes(sig):
    server = ServerProcess(TINY)
    kids = server.children
    assert len(kids) >= 2
    r = httpx.post(server.url + "/v1/completions", json={"model": "tiny-llama", "prompt": "hi", "max_tokens": 2}, timeout=60)
    assert r.status_code == 200
    server.stop(sig)
    assert server.proc.returncode == 0
    time.sleep(0.5)
    assert not [p for p in kids if pid_alive(p)], "server left processes behind"


def test_online_benchmark_client_measures_a_run(tiny_server):
    from minisgl.benchmark.online import run
    from minisgl.benchmark.offline import make_workload

    w = make_workload(6, 4, 12, 2, 6, seed=0)
    report = asyncio.run(run(tiny_server.url, w.prompts, w.max_tokens, concurrency=3))
    assert report.output_tokens == sum(w.max_tokens)  # EOS is ignored: every token asked for
    assert report.input_tokens == w.input_tokens
    assert 0 < report.ttft_ms["p50"] <= report.e2e_ms["p50"] and report.ttft_ms["max"] <= report.e2e_ms["max"]
    assert report.output_throughput == pytest.approx(report.output_tokens / report.wall_s)
    assert_all_free(tiny_server)
