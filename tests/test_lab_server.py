"""`make lab`'s JupyterLab, started the way the Makefile starts it, on a fresh home directory
(as on a fresh clone): what a learner's browser gets from the server.

The lab serves a scratch workbook (the lab's configuration and three chapters copied, the rest
linked to this checkout), so a test can change a chapter under the running lab as a pull would."""

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

from file_module import load_file
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


CHAPTERS = ("index.ipynb", "01_core.ipynb", "09_radix_cache.ipynb")
LINKED = ("exercises", "judge", "judge.py", "minisgl", "tools", "README.md", "models")


def _workbook(root: Path) -> Path:
    """A workbook whose chapters/ the tests may change: the lab's configuration and CHAPTERS copied,
    everything else linked to this checkout."""
    shutil.copytree(REPO / ".jupyter", root / ".jupyter")
    (root / "chapters").mkdir()
    for name in CHAPTERS:
        shutil.copy2(REPO / "chapters" / name, root / "chapters" / name)
    for name in LINKED:
        (root / name).symlink_to(REPO / name)
    return root


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return _workbook(tmp_path_factory.mktemp("workbook"))


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    """The learner's fresh home directory; the lab's log is lab.log there."""
    return tmp_path_factory.mktemp("home")


@pytest.fixture(scope="module")
def lab(home, root):
    # a ~/.bashrc that puts another `python` first, as conda's does, must not win in a terminal
    decoy = home / "decoy-bin"
    decoy.mkdir()
    (decoy / "python").write_text("#!/bin/sh\necho 'not the workbook python'\n")
    (decoy / "python").chmod(0o755)
    (home / ".bashrc").write_text(f'export PATH="{decoy}:$PATH"\n')
    port = free_port()
    assert 'JUPYTER_CONFIG_PATH="$(CURDIR)/.jupyter' in _make_lab_command()
    env = {**os.environ, "HOME": str(home), "JUPYTER_CONFIG_PATH": str(root / ".jupyter"), "SHELL": shutil.which("bash") or "/bin/sh"}
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


def test_serves_the_workbook_root_and_opens_the_index(lab):
    # even started from elsewhere (cwd is the fresh home), the root is the workbook's
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


def test_terminal_finds_this_python_first_and_runs_the_judge(lab, root):
    out = asyncio.run(_terminal(lab, "python -c 'import sys; print(\"PREFIX=\" + sys.prefix)'; pwd; python judge.py list > /dev/null && echo LIST-OK"))
    lines = out.splitlines()
    prefix = [line[len("PREFIX="):] for line in lines if line.startswith("PREFIX=")]
    assert prefix and Path(prefix[0]).resolve() == Path(sys.prefix).resolve(), out
    assert str(root) in lines, out  # terminals start at the root, where the README's commands run
    assert "LIST-OK" in lines and "not the workbook python" not in out, out


def test_a_chapter_saved_on_another_python_opens_and_saves_unchanged(lab, root):
    """The lab writes the kernel's language_info on open; a chapter last run on another Python
    must neither look modified to it nor change when it saves the chapter unrun."""
    nb = json.loads((REPO / "chapters" / "index.ipynb").read_text())
    nb["metadata"]["language_info"]["version"] = "3.0.0"
    text = json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    name = f"zz_lab_test_{os.getpid()}.ipynb"
    path = root / "chapters" / name
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


def _trusted(url: str, name: str) -> bool:
    cells = _get(url, f"/api/contents/chapters/{name}").json()["content"]["cells"]
    return all(c["metadata"].get("trusted") for c in cells if c["cell_type"] == "code")


def test_a_chapter_that_a_pull_or_fresh_brings_opens_trusted(lab, root):
    """Saved widget views render only in a trusted notebook: a chapter changed under the running
    lab (as `git pull` does) and the shipped chapter that `make fresh` brings back are trusted."""
    copies = load_file(root / "tools" / "learner_copies.py", "_learner_copies_lab_test")
    assert _trusted(lab, "01_core.ipynb")
    path = root / "chapters" / "01_core.ipynb"
    nb = json.loads(path.read_text())
    nb["cells"].append({"cell_type": "code", "execution_count": None, "id": "pulled", "metadata": {},
                        "outputs": [], "source": "x = 'a newer chapter'"})
    path.write_text(json.dumps(nb, indent=1))
    model = _get(lab, "/api/contents/chapters/01_core.ipynb").json()
    assert model["content"]["cells"][-1]["source"] == "x = 'a newer chapter'"
    assert _trusted(lab, "01_core.ipynb")

    # the learner runs it (the lab saves their copy), then `make fresh N=01` puts the copy aside
    saved = httpx.put(f"{lab}/api/contents/chapters/01_core.ipynb", params={"token": TOKEN}, timeout=60,
                      json={"type": "notebook", "format": "json", "content": model["content"]})
    assert saved.status_code == 200, saved.text
    assert copies.state("01_core.ipynb", root) == "yours"
    nb["cells"][-1]["source"] = "x = 'newer still'"
    path.write_text(json.dumps(nb, indent=1))
    assert copies.put_aside("01_core.ipynb", root) is not None
    assert _get(lab, "/api/contents/chapters/01_core.ipynb").json()["content"]["cells"][-1]["source"] == "x = 'newer still'"
    assert _trusted(lab, "01_core.ipynb")


async def _execute(url: str, kernel_id: str, code: str) -> str:
    """Run `code` in a kernel over the lab's websocket; its printed and displayed text."""
    import uuid

    from tornado.websocket import websocket_connect

    ws = await websocket_connect(f"{url.replace('http', 'ws')}/api/kernels/{kernel_id}/channels?token={TOKEN}")
    msg_id = uuid.uuid4().hex
    await ws.write_message(json.dumps({
        "header": {"msg_id": msg_id, "username": "test", "session": uuid.uuid4().hex, "msg_type": "execute_request",
                   "version": "5.3"},
        "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
        "content": {"code": code, "silent": False, "store_history": True, "user_expressions": {}, "allow_stdin": False,
                    "stop_on_error": True},
    }))
    out, replied, idle = [], False, False
    while not (replied and idle):
        msg = json.loads(await asyncio.wait_for(ws.read_message(), 120))
        if msg.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        replied |= kind == "execute_reply"
        idle |= kind == "status" and content.get("execution_state") == "idle"
        if kind == "stream":
            out.append(content["text"])
        elif kind in ("execute_result", "display_data"):
            out.append(content["data"].get("text/plain", ""))
        elif kind == "error":
            out.append(f"{content['ename']}: {content['evalue']}")
    ws.close()
    return "".join(out)


def test_judge_works_in_a_fresh_and_a_restarted_kernel(lab, home):
    """A learner who restarts the kernel and runs only the exercise cell gets the judge, not
    "Cell magic `%%judge` not found"; kernels start without the unencrypted-TCP warning."""
    starter = (REPO / "exercises" / "req-lengths" / "starter.py").read_text()
    params = {"token": TOKEN}
    started = httpx.post(f"{lab}/api/kernels", params=params, json={"name": "python3", "path": "chapters/01_core.ipynb"}, timeout=60)
    assert started.status_code == 201, started.text
    kernel = started.json()["id"]
    try:
        first = asyncio.run(_execute(lab, kernel, "%%judge req-lengths\n" + starter))
        assert "req-lengths: not started" in first, first
        assert httpx.post(f"{lab}/api/kernels/{kernel}/restart", params=params, timeout=60).status_code == 200
        again = asyncio.run(_execute(lab, kernel, "%%judge req-lengths\n" + starter))
        assert "req-lengths: not started" in again, again
        assert "UsageError" in asyncio.run(_execute(lab, kernel, "%%judge\npass"))  # and its usage message
    finally:
        httpx.delete(f"{lab}/api/kernels/{kernel}", params=params, timeout=60)
    log = (home / "lab.log").read_text()
    assert "Kernel started" in log and "without encryption" not in log, log[-3000:]


def test_kernels_of_closed_notebooks_do_not_stay(lab, home):
    """Closing a notebook shuts its kernel down, and a kernel no tab is connected to is culled
    once idle (the server starts its culler with the first kernel)."""
    tracker = _get(lab, "/lab/api/settings/@jupyterlab/notebook-extension:tracker").json()
    assert tracker["schema"]["properties"]["kernelShutdown"]["default"] is True
    if "Culling kernels" not in (home / "lab.log").read_text():  # no kernel started yet (this test run alone)
        kernel = httpx.post(f"{lab}/api/kernels", params={"token": TOKEN}, json={"name": "python3"}, timeout=60).json()["id"]
        httpx.delete(f"{lab}/api/kernels/{kernel}", params={"token": TOKEN}, timeout=60)
    log = (home / "lab.log").read_text()
    assert re.search(r"Culling kernels with idle durations > \d+ seconds", log), log[-3000:]
    assert "even with connected clients" not in log and "even if busy" not in log


def test_the_workbook_stylesheet_is_loaded(lab):
    """custom/custom.css: a link whose text is code takes the theme's link colour."""
    assert 'custom/custom.css"' in _get(lab, "/lab").text
    css = _get(lab, "/custom/custom.css")
    assert css.status_code == 200 and "a code" in css.text and "var(--jp-content-link-color)" in css.text
