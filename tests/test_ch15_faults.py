"""Chapter 15: faults fail fast. A dead engine process ends every request with a JSON 503 and
the server exits non-zero; an engine that fails to start ends the server with its error (no port
left saying "starting"); SIGTERM drains (in-flight requests finish, the rest get a JSON error,
exit status 0); /health answers while the scheduler cannot, and says it is busy, not dead.
Each test starts its own tiny-llama server, since each ends it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
import uvicorn

from minisgl.scheduler import SchedulerConfig
from minisgl.server.args import ServerArgs
from server_utils import REPO_ROOT, ServerProcess, child_pids, free_port, pid_alive

TINY = "models/tiny-llama"
LONG = {"model": "tiny-llama", "prompt": "Tell me everything.", "max_tokens": 1900, "ignore_eos": True, "temperature": 0}


def process_pid(server: ServerProcess, name: str) -> int:
    """The pid of the server's scheduler or tokenizer process (they name themselves, see launch.py)."""
    for pid in server.children:
        try:
            if open(f"/proc/{pid}/comm").read().strip() == f"minisgl-{name[:5]}":
                return pid
        except OSError:
            pass
    raise AssertionError(f"no {name} process among {server.children}")


async def _stream(url: str, body: dict, started: asyncio.Event) -> tuple[str, dict]:
    """Stream a completion; set `started` at its first text. Returns (text, the error event or {})."""
    text = ""
    async with httpx.AsyncClient(timeout=120) as client:
        async with client.stream("POST", url + "/v1/completions", json={**body, "stream": True}) as r:
            assert r.status_code == 200, await r.aread()
            async for line in r.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    event = json.loads(line[6:])
                    if "error" in event:
                        return text, event
                    text += event["choices"][0]["text"]
                    started.set()
    return text, {}


async def _post(url: str, body: dict) -> httpx.Response:
    async with httpx.AsyncClient(timeout=120) as client:
        return await client.post(url + "/v1/completions", json=body)


async def _during(action, streams: list, posts: list = ()) -> list:
    """Start the streams (url, body) and posts (coroutines); once every stream has text, do
    `action`; then collect every result."""
    flags = [asyncio.Event() for _ in streams]
    tasks = [asyncio.ensure_future(_stream(url, body, f)) for (url, body), f in zip(streams, flags)]
    tasks += [asyncio.ensure_future(p) for p in posts]
    await asyncio.wait_for(asyncio.gather(*(f.wait() for f in flags)), 120)
    await asyncio.sleep(0.2)  # the posts are in the scheduler by now
    action()
    return await asyncio.wait_for(asyncio.gather(*tasks), 60)


@pytest.mark.parametrize("victim", ["scheduler", "tokenizer"])
def test_a_dead_engine_process_fails_every_request_and_the_server_exits(victim):
    server = ServerProcess(TINY)
    kids = list(server.children)
    pid = process_pid(server, victim)
    killed_at = []
    kill = lambda: (os.kill(pid, signal.SIGKILL), killed_at.append(time.monotonic()))  # noqa: E731
    (_, streamed), plain = asyncio.run(_during(kill, [(server.url, LONG)], [_post(server.url, LONG)]))
    assert time.monotonic() - killed_at[0] < 5, "the requests were not failed fast"
    assert streamed["error"]["type"] == "service_unavailable" and victim in streamed["error"]["message"]
    assert plain.status_code == 503 and victim in plain.json()["error"]["message"]
    server.proc.wait(30)
    assert time.monotonic() - killed_at[0] < 10, "the server took long to exit"
    assert server.proc.returncode == 1, server.output()
    server.stop()
    time.sleep(0.5)
    assert not [p for p in kids if pid_alive(p)], "server left processes behind"


def test_an_engine_that_fails_to_start_ends_the_server_with_its_error():
    # a KV budget too small for one context: the scheduler process refuses it while loading
    cmd = [sys.executable, "-m", "minisgl", "--model", str(REPO_ROOT / TINY), "--port", str(free_port()),
           "--device", "cpu", "--cpu-kv-budget-gb", "0.0001"]
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    kids, deadline = set(), time.monotonic() + 240
    while proc.poll() is None:
        assert time.monotonic() < deadline, "the server neither started nor exited"
        kids.update(child_pids(proc.pid))  # all it ever started, to check none is left
        time.sleep(0.05)
    out = proc.stdout.read()
    assert proc.wait(120) == 1, out
    lines = out.splitlines()
    assert "minisgl: waiting for the scheduler to load tiny-llama onto cpu" in lines, out  # it said what it waited for
    assert lines[-1].startswith("minisgl: the scheduler process failed to start: MemoryError: the KV budget"), out
    assert "cpu_kv_budget_gb" in lines[-1], out  # the message says what to change
    time.sleep(0.5)
    assert kids and not [p for p in kids if pid_alive(p)], "the server left processes behind"


def test_sigterm_drains_in_flight_requests_then_fails_the_rest():
    # sized for a 2-core CPU: the short request is still running at SIGTERM (0.2 s after its first token)
    # and ends well within the drain time; the long one could end within it only on a far faster machine
    server = ServerProcess(TINY, "--drain-timeout", "1.5")
    short = {"model": "tiny-llama", "prompt": "Hi", "max_tokens": 150, "ignore_eos": True, "temperature": 0}
    sigterm = lambda: server.proc.send_signal(signal.SIGTERM)  # noqa: E731
    (text, short_error), (long_text, long_error) = asyncio.run(_during(sigterm, [(server.url, short), (server.url, LONG)]))
    assert short_error == {} and text  # it was running at SIGTERM, and finished within the drain time
    assert long_error, f"the long request ended within the drain time ({len(long_text)} characters): a faster machine"
    assert long_error["error"]["type"] == "service_unavailable" and "drain" in long_error["error"]["message"]
    server.proc.wait(30)
    assert server.proc.returncode == 0, server.output()
    with pytest.raises(httpx.ConnectError):
        httpx.post(server.url + "/v1/completions", json=short, timeout=5)
    server.stop()


def test_a_drain_shuts_down_only_after_every_failed_stream_has_its_error():
    # a handler behind a backlog of tokens reaches its error late: uvicorn must not stop before it has
    from minisgl.server.drain import DrainingServer
    from minisgl.server.frontend import Lifecycle

    class Frontend:  # one request still open when the drain time ends, its handler slow to answer
        open = {7: None}

        def fail_all(self, status: int, message: str) -> int:
            return len(self.open)

    frontend = Frontend()
    server = DrainingServer(uvicorn.Config(lambda scope, receive, send: None), Lifecycle(), frontend, drain_s=0.1)

    async def drain() -> None:
        task = asyncio.ensure_future(server._drain())
        await asyncio.sleep(1.5)
        assert not server.should_exit, "uvicorn was told to stop while a client still waited for its error"
        frontend.open = {}  # the handler has sent the error
        await asyncio.wait_for(task, 1)
        assert server.should_exit

    asyncio.run(drain())


def test_health_answers_while_the_scheduler_cannot():
    server = ServerProcess(TINY)
    try:
        assert server.health()["status"] == "ok"
        pid = process_pid(server, "scheduler")
        os.kill(pid, signal.SIGSTOP)  # alive but not stepping: what a very long step looks like
        try:
            t0 = time.monotonic()
            r = httpx.get(server.url + "/health", timeout=30)
            assert time.monotonic() - t0 < 5
            assert r.status_code == 200 and r.json()["status"] == "busy", r.text
        finally:
            os.kill(pid, signal.SIGCONT)
        assert server.health()["status"] == "ok"
    finally:
        assert server.stop() == 0


def test_prefill_is_chunked_by_default_with_a_budget_for_the_device():
    cpu = ServerArgs.from_options(model_path=str(REPO_ROOT / TINY), device="cpu").scheduler
    assert cpu.max_extend_tokens == 256
    assert SchedulerConfig(engine=cpu.engine, max_extend_tokens=100).max_extend_tokens == 100
