"""JupyterLab as the workbook wants it; `make lab` points JUPYTER_CONFIG_PATH at this folder.

- the lab serves the repository root, so a chapter's links to exercises/<id>/README.md and to
  work/<id>.py open in it, and it starts on chapters/index.ipynb;
- kernels and terminals find this Python (the workbook's .venv, or the conda environment the
  lab runs in) first on the PATH, so `python judge.py ...` works in them as the README says;
- the chapters as shipped are trusted, also after a pull or `make fresh` brings a new version
  while the lab runs, so their saved widget views render before a cell runs;
- every Python kernel registers `%%judge` as it starts (kernel_startup.py), so an exercise cell
  works in a fresh or restarted kernel; kernels talk to the server over encrypted sockets;
- a notebook's kernel shuts down when its tab closes (labconfig/default_setting_overrides.json),
  and a kernel left with no tab open is shut down after CULL_IDLE_S of idleness;
- opening a chapter and saving it unrun leave it byte for byte as it was (see
  WorkbookContentsManager), and a chapter you run or edit is saved to your copy in
  work/chapters/ (tools/learner_copies.py), so a reader's git tree stays clean;
- a link whose text is code looks like a link (custom/custom.css);
- no first-run questions (the news pop-up is switched off in labconfig/page_config.json).

Your own ~/.jupyter configuration still applies and wins where both set something.
"""

import json
import os
import sys
from pathlib import Path

import zmq
from jupyter_client.kernelspec import NoSuchKernel
from jupyter_core.paths import jupyter_config_dir
from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager
from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager


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
# custom/custom.css beside this file: small fixes to how chapters render (links whose text is code)
c.LabApp.custom_css = True
c.ServerApp.tornado_settings = {"static_custom_path": [os.path.join(jupyter_config_dir(), "custom"),
                                                       str(Path(__file__).resolve().parent / "custom")]}

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

    def mark_trusted_cells(self, nb, path=""):
        """A shipped chapter is trusted as it is read, so one that a pull or `make fresh` brought
        while the lab runs opens trusted too (Jupyter's own rule trusts only what it signed before).
        Every other notebook, your copies included, keeps that rule: the lab signs what it saves."""
        if self.reads_shipped(path) and not self.notary.check_signature(nb):
            self.notary.sign(nb)
        super().mark_trusted_cells(nb, path)


c.ServerApp.contents_manager_class = WorkbookContentsManager


KERNEL_STARTUP = Path(__file__).resolve().parent / "kernel_startup.py"


class WorkbookKernelManager(AsyncMappingKernelManager):
    """Starts every ipykernel with kernel_startup.py, which registers `%%judge`: after a restart a
    learner often runs the exercise cell first."""

    async def start_kernel(self, *, kernel_id=None, path=None, **kwargs):
        name = kwargs.get("kernel_name") or self.default_kernel_name
        try:
            argv = self.kernel_spec_manager.get_kernel_spec(name).argv
        except NoSuchKernel:  # the server reports it as it always does
            argv = []
        if any("ipykernel" in arg for arg in argv):
            kwargs["extra_arguments"] = [*kwargs.get("extra_arguments", []),
                                         f"--IPKernelApp.exec_files={KERNEL_STARTUP}"]
        return await super().start_kernel(kernel_id=kernel_id, path=path, **kwargs)


c.ServerApp.kernel_manager_class = WorkbookKernelManager
# Closing a notebook's tab shuts its kernel down (labconfig/default_setting_overrides.json); a kernel
# whose notebook is no longer open anywhere (a closed window, a crashed browser) still holds its
# memory, hundreds of MB a chapter: it is shut down once idle this long. An open notebook's kernel
# and a busy one are never culled.
CULL_IDLE_S = 15 * 60
c.MappingKernelManager.cull_idle_timeout = CULL_IDLE_S
c.MappingKernelManager.cull_interval = 60
c.MappingKernelManager.cull_connected = False
c.MappingKernelManager.cull_busy = False


# The server hands each kernel CurveZMQ keys when its kernel spec supports them (ipykernel does):
# its sockets are encrypted, and it no longer warns at start that they are not. (A libzmq built
# without CURVE would refuse the setting.)
if zmq.has("curve"):
    c.MappingKernelManager.transport_encryption = "auto"


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
