"""Stored notebook outputs must match the package as it is now, without running anything.

`book.show(...)` and `book.files_added(...)` tag their outputs with what produced them; here
each tagged output is recomputed from the current source and compared. A renamed symbol, an
edited function or a new file in a chapter makes the stored notebook stale, and this fails
(re-run the notebook: `jupyter nbconvert --to notebook --execute --inplace chapters/NN_*.ipynb`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from file_module import load_file

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = ROOT / "chapters"
NOTEBOOKS = sorted(p for p in CHAPTERS.glob("*.ipynb"))


book = load_file(CHAPTERS / "book.py", "_book_under_test")


def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else value


def _tagged_outputs(nb: dict):
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        for out in cell.get("outputs", []):
            meta = out.get("metadata", {})
            if "minisgl_show" in meta or "minisgl_files_added" in meta:
                yield i, meta, _text(out.get("data", {}).get("text/plain", ""))


def test_there_are_chapter_notebooks():
    assert any(p.name.startswith("00_") for p in NOTEBOOKS), "chapters/00_*.ipynb is missing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_was_executed(path: Path):
    nb = json.loads(path.read_text())
    unrun = [i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code" and c["source"] and c.get("execution_count") is None]
    assert not unrun, f"{path.name}: code cells {unrun[:5]} have never been run; execute the notebook and save it"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_shown_source_is_current(path: Path):
    nb = json.loads(path.read_text())
    stale = []
    for i, meta, stored in _tagged_outputs(nb):
        if "minisgl_show" in meta:
            tag = meta["minisgl_show"]
            try:
                fresh = repr(book.source(tag["target"], tag["chapter"]))
            except (LookupError, FileNotFoundError, ValueError) as e:
                stale.append(f"cell {i}: show({tag['target']!r}) no longer resolves: {e}")
                continue
        else:
            fresh = repr(book.files_added(meta["minisgl_files_added"]["chapter"]))
        if fresh != stored:
            stale.append(f"cell {i}: stored output differs from the current package:\n{fresh.splitlines()[0]}")
    assert not stale, f"{path.name} is stale; re-run it.\n" + "\n".join(stale)
