"""The learner loop: the lab saves a chapter to work/chapters/, never to the tracked notebook, so
`git pull` cannot conflict with a learner's runs and edits, and a newer chapter never overwrites them.

Driven through the lab's real contents manager class (the one .jupyter/ configures) on a scratch
repository, and through git itself: a pull after running and editing chapters."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from file_module import load_file

ROOT = Path(__file__).resolve().parent.parent
copies = load_file(ROOT / "tools" / "learner_copies.py", "_learner_copies_under_test")
nbformat = pytest.importorskip("nbformat")
contents = pytest.importorskip("jupyter_server.services.contents.largefilemanager")


class Manager(copies.LearnerCopies, contents.AsyncLargeFileManager):
    pass


def _chapter(path: Path, *sources: str) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# Chapter")] + [nbformat.v4.new_code_cell(s) for s in sources]
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                               "GIT_COMMITTER_EMAIL": "t@t", "HOME": str(repo), "PATH": "/usr/bin:/bin"}).stdout


def _run(manager: Manager, name: str, output: str, edit: str | None = None) -> None:
    """What the lab does when a learner runs a cell (and maybe edits it), then autosaves."""
    model = asyncio.run(manager.get(f"chapters/{name}"))
    cell = model["content"]["cells"][1]
    if edit is not None:
        cell["source"] = edit
    cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": output}]
    cell["execution_count"] = 7
    asyncio.run(manager.save({"type": "notebook", "format": "json", "content": model["content"]},
                             f"chapters/{name}"))


@pytest.fixture()
def workbook(tmp_path):
    """A shipped workbook (two chapters, work/ ignored) cloned by a learner."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    upstream = tmp_path / "upstream"
    _chapter(upstream / "chapters" / "01_core.ipynb", "x = 1")
    _chapter(upstream / "chapters" / "02_layers.ipynb", "y = 2")
    (upstream / ".gitignore").write_text((ROOT / ".gitignore").read_text())
    _git(upstream.parent, "init", "-q", "-b", "main", str(upstream))
    _git(upstream, "add", ".")
    _git(upstream, "commit", "-q", "-m", "chapters")
    learner = tmp_path / "learner"
    _git(tmp_path, "clone", "-q", str(upstream), str(learner))
    return upstream, learner


def test_running_and_editing_leave_git_clean_and_a_pull_brings_new_chapters(workbook):
    upstream, learner = workbook
    manager = Manager(root_dir=str(learner))
    _run(manager, "01_core.ipynb", "1\n")                        # ran only
    _run(manager, "02_layers.ipynb", "3\n", edit="y = 3  # mine")  # edited
    assert _git(learner, "status", "--porcelain") == "", "the tracked chapters must stay as shipped"
    assert copies.state("01_core.ipynb", learner) == copies.state("02_layers.ipynb", learner) == "yours"
    # the lab reopens the learner's copies
    again = asyncio.run(manager.get("chapters/02_layers.ipynb"))["content"]["cells"][1]
    assert again["source"] == "y = 3  # mine" and again["outputs"][0]["text"] == "3\n"

    # upstream fixes both chapters; the learner pulls
    _chapter(upstream / "chapters" / "01_core.ipynb", "x = 10")
    _chapter(upstream / "chapters" / "02_layers.ipynb", "y = 20")
    _git(upstream, "commit", "-q", "-am", "fixes")
    _git(learner, "pull", "-q", "--ff-only")
    assert "x = 10" in (learner / "chapters" / "01_core.ipynb").read_text()

    # a copy that held only outputs gives way to the new chapter, and is kept aside
    assert copies.state("01_core.ipynb", learner) == "stale"
    fresh = asyncio.run(manager.get("chapters/01_core.ipynb"))["content"]["cells"]
    assert fresh[1]["source"] == "x = 10"
    assert len(list((learner / "work" / "chapters" / "old").glob("01_core-*.ipynb"))) == 1
    # an edited copy is what the lab keeps opening, with a note on top
    assert copies.state("02_layers.ipynb", learner) == "outdated"
    cells = asyncio.run(manager.get("chapters/02_layers.ipynb"))["content"]["cells"]
    assert cells[0]["metadata"] == {copies.NOTE_KEY: True} and "make fresh N=02" in cells[0]["source"]
    assert "`make fresh N=02`" in copies.describe("02_layers.ipynb", learner)  # the listing names the chapter too
    assert cells[2]["source"] == "y = 3  # mine"
    # saving does not store the note; `fresh` puts the copy aside and the new chapter opens
    asyncio.run(manager.save({"type": "notebook", "format": "json",
                              "content": asyncio.run(manager.get("chapters/02_layers.ipynb"))["content"]},
                             "chapters/02_layers.ipynb"))
    assert copies.NOTE_KEY not in (learner / "work" / "chapters" / "02_layers.ipynb").read_text()
    kept = copies.put_aside("02_layers.ipynb", learner)
    assert "y = 3  # mine" in kept.read_text()
    assert asyncio.run(manager.get("chapters/02_layers.ipynb"))["content"]["cells"][1]["source"] == "y = 20"
    assert _git(learner, "status", "--porcelain") == ""


def test_deleting_a_chapter_in_the_lab_keeps_the_learners_copy(workbook):
    _, learner = workbook
    manager = Manager(root_dir=str(learner))
    _run(manager, "01_core.ipynb", "1\n", edit="x = 'mine'")
    asyncio.run(manager.delete_file("chapters/01_core.ipynb"))
    assert (learner / "chapters" / "01_core.ipynb").is_file(), "the shipped chapter stays"
    (kept,) = (learner / "work" / "chapters" / "old").glob("01_core-*.ipynb")
    assert "x = 'mine'" in kept.read_text()


def test_only_shipped_chapters_are_redirected(workbook):
    _, learner = workbook
    manager = Manager(root_dir=str(learner))
    scratch = {"type": "notebook", "format": "json", "content": nbformat.v4.new_notebook()}
    asyncio.run(manager.save(scratch, "chapters/scratch.ipynb"))
    asyncio.run(manager.save(scratch, "notes.ipynb"))
    assert (learner / "chapters" / "scratch.ipynb").is_file() and (learner / "notes.ipynb").is_file()
    assert not (learner / "work").exists()


def test_the_lab_uses_the_learner_copies():
    """.jupyter/'s contents manager is the one tested above."""
    config = (ROOT / ".jupyter" / "jupyter_server_config.py").read_text()
    assert "LearnerCopies" in config and "class WorkbookContentsManager(LearnerCopies," in config


def test_fresh_names_a_chapter_by_number(tmp_path, capsys):
    assert copies.main(["fresh", "99"]) == 2
    assert "no single chapter matches '99'" in capsys.readouterr().err
    json.loads((ROOT / "chapters" / "index.ipynb").read_text())  # the index is a chapter name too
    assert copies.is_chapter(ROOT / "chapters" / "index.ipynb") and copies.is_chapter(ROOT / "chapters" / "07_scheduler.ipynb")
    assert not copies.is_chapter(ROOT / "chapters" / "zz_lab_test_1.ipynb")
