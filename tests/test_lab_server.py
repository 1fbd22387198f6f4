"""`make lab`'s JupyterLab, started the way the Makefile starts it, on a fresh home directory
(as on a fresh clone): what a learner's browser gets from the server."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from server_utils import free_port

REPO = Path(__file__).resolve().parents[1]
TOKEN = "lab-test-token"
JUPYTER = Path(sys.executable).parent / "jupyter"

pytestmark = pytest.mark.skipif(not JUPYTER.exists(), reason="JupyterLab is not installed (the `lab` extra)")


def _make_lab_command() -> str:
    """The lab target's recipe, read from the Makefile so the test starts what `make lab` does."""
    text = (REPO / "Makefile").read_text()
    recipe = re.search(r"^lab:.*\n((?:\t.*\n)+)", text, re.M)
    assert recipe, "the Makefile has no lab target"
    return recipe.group(1)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    # a ~/.bashrc that puts another `python` first, as conda's does, must not win in a terminal
    decoy = home / "decoy-bin"
    decoy.mkdir()
    (decoy / "python").write_text("#!/bin/sh\necho 'not the workbook python'\n")
    (decoy / "python").chmod(0o755)
    (home / ".bashrc").write_text(f'export PATH="{decoy}:$PATH"\n')
    port = free_port()
    assert 'JUPYTER_CONFIG_PATH="$(CURDIR)/.jupyter' in _make_lab_command()
    env = {**os.environ, "HOME": str(home), "JUPYTER_CONFIG_PATH": str(REPO / ".jupyter"), "SHELL": shutil.which("bash") or "/bin/sh"}
    for var in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "JUPYTERLAB_SETTINGS_DIR", "JUPYTERLAB_WORKSPACES_DIR"):
        env.pop(var, None)
    log = open(home / "lab.log", "w+")
    cmd = [str(JUPYTER), "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}", f"--IdentityProvider.token={TOKEN}"]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    proc = subprocess.Popen(cmd, cwd=home, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    try:
        while True:
            if proc.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"jupyter lab exited with {proc.returncode}:\n{log.read()}")
            try:
                if httpx.get(f"{url}/api/status", params={"token": TOKEN}, timeout=10).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("jupyter lab did not answer within 120 s")
            time.sleep(0.5)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def _get(url: str, path: str) -> httpx.Response:
    return httpx.get(f"{url}{path}", params={"token": TOKEN}, timeout=60)


def test_serves_the_repository_root_and_opens_the_index(lab):
    # even started from elsewhere (cwd is the fresh home), the root is the repository
    assert _get(lab, "/api/contents/exercises/req-lengths/README.md").json()["content"].startswith("# req-lengths")
    root = {item["name"] for item in _get(lab, "/api/contents").json()["content"]}
    assert {"chapters", "exercises", "judge.py", "README.md"} <= root
    assert _get(lab, "/").headers["location"].startswith("/lab/tree/chapters/index.ipynb")


def test_shipped_chapters_are_trusted(lab):
    """Trusted notebooks are what lets the lab render saved widget views before a cell runs."""
    for name in ("01_core.ipynb", "09_radix_cache.ipynb", "index.ipynb"):
        cells = _get(lab, f"/api/contents/chapters/{name}").json()["content"]["cells"]
        assert all(c["metadata"].get("trusted") for c in cells if c["cell_type"] == "code"), name


def test_no_news_question_on_first_open(lab):
    config = json.loads(re.search(r'id="jupyter-config-data"[^>]*>\s*(\{.*?\})\s*</script>', _get(lab, "/lab").text, re.S).group(1))
    assert "@jupyterlab/apputils-extension:announcements" in config["disabledExtensions"]


async def _terminal(url: str, command: str) -> str:
    from tornado.websocket import websocket_connect

    async with httpx.AsyncClient(timeout=60) as client:
        name = (await client.post(f"{url}/api/terminals", params={"token": TOKEN}, json={})).json()["name"]
        ws = await websocket_connect(f"{url.replace('http', 'ws')}/terminals/websocket/{name}?token={TOKEN}")
        await ws.write_message(json.dumps(["stdin", f"{command}; echo END-OF-TEST\r"]))
        out = ""
        while not re.search(r"\nEND-OF-TEST\r?\n", out):
            kind, *data = json.loads(await asyncio.wait_for(ws.read_message(), 120))
            if kind == "stdout":
                out += data[0]
        ws.close()
        await client.delete(f"{url}/api/terminals/{name}", params={"token": TOKEN})
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out).replace("\r", "")  # without control sequences


def test_terminal_finds_this_python_first_and_runs_the_judge(lab):
    out = asyncio.run(_terminal(lab, "python -c 'import sys; print(\"PREFIX=\" + sys.prefix)'; pwd; python judge.py list > /dev/null && echo LIST-OK"))
    lines = out.splitlines()
    prefix = [line[len("PREFIX="):] for line in lines if line.startswith("PREFIX=")]
    assert prefix and Path(prefix[0]).resolve() == Path(sys.prefix).resolve(), out
    assert str(REPO) in lines, out  # terminals start at the root, where the README's commands run
    assert "LIST-OK" in lines and "not the workbook python" not in out, out


def test_a_chapter_saved_on_another_python_opens_and_saves_unchanged(lab):
    """The lab writes the kernel's language_info on open; a chapter last run on another Python
    must neither look modified to it nor change when it saves the chapter unrun."""
    nb = json.loads((REPO / "chapters" / "index.ipynb").read_text())
    nb["metadata"]["language_info"]["version"] = "3.0.0"
    text = json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    name = f"zz_lab_test_{os.getpid()}.ipynb"
    path = REPO / "chapters" / name
    path.write_text(text)
    try:
        model = _get(lab, f"/api/contents/chapters/{name}").json()
        assert model["content"]["metadata"]["language_info"]["version"] == sys.version.split()[0]
        saved = httpx.put(f"{lab}/api/contents/chapters/{name}", params={"token": TOKEN}, timeout=60,
                          json={"type": "notebook", "format": "json", "content": model["content"]})
        assert saved.status_code == 200, saved.text
        assert path.read_text() == text
    finally:
        path.unlink()
