"""Start a real `python -m minisgl` server on a free port for the serving tests, and take it down;
the module-scoped fixtures those tests share (one server, one offline LLM, one client per module)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, List, Optional

import httpx
import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_pids(pid: int) -> List[int]:
    """Direct children of `pid` (Linux /proc)."""
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def pid_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.split(")")[-1].split()[0] != "Z"  # a zombie has exited


class ServerProcess:
    def __init__(self, model: str, *extra: str, timeout_s: float = 300.0):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "minisgl", "--model", str(REPO_ROOT / model), "--port", str(self.port), *extra]
        self.log = tempfile.NamedTemporaryFile("w+", prefix="minisgl-server-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.output()}")
            try:
                if httpx.get(self.url + "/health", timeout=30).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"server not up within {timeout_s} s:\n{self.output()}")
            time.sleep(0.5)
        self.children = child_pids(self.proc.pid)

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def health(self) -> dict:
        return httpx.get(self.url + "/health", timeout=30).json()

    def wait_idle(self, timeout_s: float = 30.0) -> dict:
        deadline = time.monotonic() + timeout_s
        while True:
            h = self.health()
            if h["idle"] and h["live_requests"] == 0 or time.monotonic() > deadline:
                return h
            time.sleep(0.2)

    def stop(self, sig: int = signal.SIGTERM) -> Optional[int]:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        os.unlink(self.log.name)
        return self.proc.returncode


@contextmanager
def server_in_thread(app) -> Iterator[str]:
    """Serve an app built by `create_app` with uvicorn on a free port, in a thread of this process
    (so the test holds the very objects it serves); yields the URL. Leaving shuts it down, which
    stops the engine's processes; a server that ends itself (a failed start-up) ends the thread."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning"))
    app.state.lifecycle.stop_serving = lambda: setattr(server, "should_exit", True)
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start listening"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{server.config.port}"
    finally:
        server.should_exit = True
        thread.join(30)
        assert not thread.is_alive(), "the server did not shut down"


def post(server: "ServerProcess", body: dict, path: str = "/v1/completions") -> httpx.Response:
    """One JSON request to a running server (raw HTTP: status codes and error bodies as sent)."""
    return httpx.post(server.url + path, json=body, timeout=120)


def assert_all_free(server: "ServerProcess") -> None:
    """Once idle, the server holds nothing: every table row and KV page is free (or cached)."""
    h = server.wait_idle()
    assert h["idle"] and h["live_requests"] == 0, h
    assert h["integrity_ok"], h
    assert h["free_rows"] == h["total_rows"], h
    assert h["free_pages"] + h["cached_pages"] == h["total_pages"], h


def openai_client(server: "ServerProcess"):
    """The `openai` client pointed at a running server; no retries, so a failure shows at once."""
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def server_fixture(model: str, *extra: str):
    """A module-scoped fixture: one server on `model` (with the extra command-line flags) for the
    whole test module, stopped after its last test. `server = server_fixture(TINY, "--dtype", "float32")`."""

    @pytest.fixture(scope="module")
    def fixture():
        server = ServerProcess(model, *extra)
        yield server
        server.stop()

    return fixture


def llm_fixture(model: str, **kwargs):
    """A module-scoped fixture: the offline `LLM` on `model`, the oracle the server is compared with."""

    @pytest.fixture(scope="module")
    def fixture():
        from minisgl.llm import LLM

        return LLM(REPO_ROOT / model, **kwargs)

    return fixture


def client_fixture():
    """A module-scoped fixture: the `openai` client for the module's `server` fixture."""

    @pytest.fixture(scope="module")
    def fixture(server):
        return openai_client(server)

    return fixture
