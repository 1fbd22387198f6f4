"""JupyterLab as the workbook wants it; `make lab` points JUPYTER_CONFIG_PATH at this folder.

- the lab serves the repository root, so a chapter's links to exercises/<id>/README.md and to
  work/<id>.py open in it, and it starts on chapters/index.ipynb;
- kernels and terminals find this Python (the workbook's .venv, or the conda environment the
  lab runs in) first on the PATH, so `python judge.py ...` works in them as the README says;
- the chapters as shipped are trusted, so their saved widget views render before a cell runs;
- opening a chapter and saving it unrun leave it byte for byte as it was (see
  WorkbookContentsManager), and a chapter you run or edit is saved to your copy in
  work/chapters/ (tools/learner_copies.py), so a reader's git tree stays clean;
- no first-run questions (the news pop-up is switched off in labconfig/page_config.json).

Your own ~/.jupyter configuration still applies and wins where both set something.
"""

import json
import os
import sys
from pathlib import Path

from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager


def _load_learner_copies():
    """tools/learner_copies.py, loaded by path (tools/ is not put on the lab's sys.path)."""
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "tools" / "learner_copies.py"
    spec = importlib.util.spec_from_file_location("minisgl_learner_copies", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


LearnerCopies = _load_learner_copies().LearnerCopies

c = get_config()  # noqa: F821  (defined by the loader of Jupyter config files)

REPO = Path(__file__).resolve().parent.parent
BIN = os.path.dirname(sys.executable)  # the interpreter running the lab: .venv/bin under `make lab`

c.ServerApp.root_dir = str(REPO)
c.LabApp.default_url = "/lab/tree/chapters/index.ipynb"
c.LabApp.news_url = None
c.LabApp.check_for_updates_class = "jupyterlab.NeverCheckForUpdate"

# Kernels and terminals inherit the server's environment.
if os.environ.get("PATH", "").split(os.pathsep)[0] != BIN:
    os.environ["PATH"] = BIN + os.pathsep + os.environ.get("PATH", "")
os.environ["MINISGL_BIN"] = BIN
os.environ["MINISGL_REPO"] = str(REPO)


PY_VERSION = sys.version.split()[0]  # what ipykernel reports as language_info.version


def _chapter_language_info(path: str, model: dict):
    """A chapter notebook's language_info dict inside a contents model, else None."""
    content = model.get("content")
    if model.get("type") != "notebook" or not isinstance(content, dict) or not path.strip("/").startswith("chapters/"):
        return None
    info = content.get("metadata", {}).get("language_info")
    return info if isinstance(info, dict) and info.get("name") == "python" else None


class WorkbookContentsManager(LearnerCopies, AsyncLargeFileManager):
    """The lab writes the kernel's language_info into a notebook as soon as it opens it, and a
    chapter saved on another Python (3.11.7 against 3.11.9) would then be marked modified and
    autosaved. So a chapter is handed to the lab with this Python's version, and saved with the
    version it has on disk: the field records where the stored outputs came from."""

    async def get(self, path, content=True, type=None, format=None, **kwargs):
        model = await super().get(path, content=content, type=type, format=format, **kwargs)
        info = _chapter_language_info(path, model)
        if info is not None:
            info["version"] = PY_VERSION
        return model

    async def save(self, model, path=""):
        info = _chapter_language_info(path, model)
        if info is not None:
            try:
                with open(self._get_os_path(path), encoding="utf-8") as f:
                    info["version"] = json.load(f)["metadata"]["language_info"]["version"]
            except (OSError, ValueError, KeyError, TypeError):
                pass  # a new notebook, or one without a stored version: keep the kernel's
        return await super().save(model, path)


c.ServerApp.contents_manager_class = WorkbookContentsManager


def _terminal_command() -> list:
    """The user's shell, with start-up files that put BIN back in front after the user's own
    (a ~/.bashrc or ~/.zshrc that activates conda would otherwise win), starting at the root."""
    shell = os.environ.get("SHELL") or "/bin/sh"
    here = Path(__file__).resolve().parent / "shell"
    name = os.path.basename(shell)
    if name == "bash":
        return [shell, "--rcfile", str(here / "bashrc"), "-i"]
    if name == "zsh":
        os.environ["MINISGL_ZDOTDIR"] = os.environ.get("ZDOTDIR", os.path.expanduser("~"))
        os.environ["ZDOTDIR"] = str(here / "zsh")
        return [shell, "-i"]
    return [shell, "-i"]  # other shells: the PATH set above


c.ServerApp.terminado_settings = {"shell_command": _terminal_command()}


def _trust_chapters() -> None:
    """What `jupyter trust chapters/*.ipynb` does: sign each notebook not signed yet."""
    import nbformat
    from nbformat.sign import NotebookNotary

    notary = NotebookNotary()
    for path in sorted((REPO / "chapters").glob("*.ipynb")):
        try:
            nb = nbformat.read(path, as_version=4)
        except Exception as exc:  # a notebook mid-edit must not stop the lab
            print(f"[minisgl] not trusting {path.name}: {exc}", file=sys.stderr)
            continue
        if not notary.check_signature(nb):
            notary.sign(nb)


_trust_chapters()
