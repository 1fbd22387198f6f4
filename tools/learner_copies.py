"""Your copies of the chapters: what you run and write in the lab never changes a tracked file.

The lab (`make lab`, configured in .jupyter/) opens `chapters/07_scheduler.ipynb` as usual, but the
first time it saves a chapter (an autosave after a cell ran, or Ctrl-S) it writes your copy,
`work/chapters/07_scheduler.ipynb` (git ignores work/), and from then on opens and saves that copy.
The shipped notebook stays as it was checked out, so `git pull` never conflicts with your work and
never overwrites it. Your copy's kernel still starts in chapters/, so imports and links behave the same.

When a pull brings a new version of a chapter you have a copy of:
- if you only ran it (no cell's source differs from the version you started from), the copy holds
  nothing but outputs: it is put aside in work/chapters/old/ and the lab opens the new version;
- if you edited it, your copy is what the lab keeps opening, with a note on top saying the chapter
  changed; `make fresh N=07` puts your copy aside (never deletes it) and reopens the new version.

    python tools/learner_copies.py            # each chapter: shipped, yours, or yours but updated since
    python tools/learner_copies.py fresh 07   # put your copy of chapter 7 aside
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import sys
import time
from pathlib import Path
from typing import List, Optional, Tuple

REPO = Path(__file__).resolve().parent.parent
CHAPTER_NAME = re.compile(r"^(\d\d_[\w.-]+|index)\.ipynb$")
NOTE_KEY = "minisgl_note"  # cell metadata of the note the lab shows on an outdated copy


def copies_dir(root: Path = REPO) -> Path:
    return root / "work" / "chapters"


def is_chapter(path: Path, root: Path = REPO) -> bool:
    """A shipped chapter notebook (chapters/NN_*.ipynb or chapters/index.ipynb)?"""
    return path.parent == root / "chapters" and CHAPTER_NAME.match(path.name) is not None


def copy_of(name: str, root: Path = REPO) -> Path:
    return copies_dir(root) / name


def shipped_base(name: str, root: Path = REPO) -> Path:
    """The shipped version a copy started from (to tell your edits from a newer chapter)."""
    return copies_dir(root) / ".shipped" / name


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def sources(path: Path) -> List[Tuple[str, str]]:
    """What you can write in a notebook: each cell's type and source, notes left out."""
    cells = json.loads(path.read_text(encoding="utf-8")).get("cells", [])
    return [(c.get("cell_type", ""), "".join(c.get("source", ""))) for c in cells
            if not c.get("metadata", {}).get(NOTE_KEY)]


def state(name: str, root: Path = REPO) -> str:
    """'shipped' (no copy), 'yours' (the lab opens your copy), 'outdated' (your copy, edited,
    of a chapter that changed since you started it) or 'stale' (a copy with outputs only, of a
    chapter that changed since: the lab puts it aside when it next opens the chapter)."""
    copy, base, shipped = copy_of(name, root), shipped_base(name, root), root / "chapters" / name
    if not copy.is_file():
        return "shipped"
    if not base.is_file() or not shipped.is_file() or _digest(base) == _digest(shipped):
        return "yours"
    return "outdated" if sources(copy) != sources(base) else "stale"


def start_copy(name: str, root: Path = REPO) -> Path:
    """Make your copy of a shipped chapter (as shipped) unless you have one; return its path."""
    copy, base = copy_of(name, root), shipped_base(name, root)
    if not copy.is_file():
        base.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / "chapters" / name, base)
        shutil.copy2(root / "chapters" / name, copy)
    return copy


def put_aside(name: str, root: Path = REPO) -> Optional[Path]:
    """Move your copy to work/chapters/old/<name>-<time>.ipynb; return where, or None if none."""
    copy = copy_of(name, root)
    if not copy.is_file():
        return None
    old = copies_dir(root) / "old"
    old.mkdir(parents=True, exist_ok=True)
    dest = old / f"{copy.stem}-{time.strftime('%Y%m%d-%H%M%S')}.ipynb"
    n = 1
    while dest.exists():
        dest = old / f"{copy.stem}-{time.strftime('%Y%m%d-%H%M%S')}-{n}.ipynb"
        n += 1
    copy.rename(dest)
    shipped_base(name, root).unlink(missing_ok=True)
    return dest


def chapter_number(name: str) -> str:
    """What `make fresh N=...` takes for a chapter: "07" for 07_scheduler.ipynb, "index" for the index."""
    return name[:2] if name[:2].isdigit() else Path(name).stem


def note_cell(name: str) -> dict:
    n = chapter_number(name)
    return {"cell_type": "markdown", "id": "minisgl-note", "metadata": {NOTE_KEY: True},
            "source": (f"**This chapter has changed since you started it.** You are reading your copy, "
                       f"`work/chapters/{name}`, kept because you edited it. `make fresh N={n}` puts "
                       "it aside in `work/chapters/old/` (nothing is deleted) and opens the new version.")}


class LearnerCopies:
    """Mixed into the lab's contents manager (.jupyter/jupyter_server_config.py): a shipped
    chapter is read from your copy when you have one, and saved only to your copy."""

    def _root(self) -> Path:
        return Path(self.root_dir).resolve()

    def _chapter_name(self, os_path: str) -> Optional[str]:
        path = Path(os_path).resolve()
        return path.name if is_chapter(path, self._root()) else None

    def _get_os_path(self, path):
        os_path = super()._get_os_path(path)
        name = self._chapter_name(os_path)
        if name is not None and copy_of(name, self._root()).is_file():
            return str(copy_of(name, self._root()))
        return os_path

    def _name_of(self, path: str) -> Optional[str]:
        return self._chapter_name(super()._get_os_path(path))

    def reads_shipped(self, path: str) -> bool:
        """Is `path` a shipped chapter that the lab reads as shipped (you have no copy of it)?"""
        name = self._name_of(path)
        return name is not None and not copy_of(name, self._root()).is_file()

    async def get(self, path, content=True, type=None, format=None, **kwargs):
        name = self._name_of(path)
        current = state(name, self._root()) if name else "shipped"
        if current == "stale":
            put_aside(name, self._root())  # outputs only: the new version opens instead
        model = await super().get(path, content=content, type=type, format=format, **kwargs)
        if current == "outdated" and content and isinstance(model.get("content"), dict):
            model["content"]["cells"].insert(0, note_cell(name))
        return model

    async def delete_file(self, path):
        name = self._name_of(path)
        if name is not None and copy_of(name, self._root()).is_file():
            put_aside(name, self._root())  # deleting your copy in the lab keeps it in work/chapters/old/
            return None
        return await super().delete_file(path)

    async def save(self, model, path=""):
        name = self._name_of(path)
        if name is not None and model.get("type") == "notebook":
            start_copy(name, self._root())
            content = model.get("content")
            if isinstance(content, dict):
                content["cells"] = [c for c in content.get("cells", []) if not c.get("metadata", {}).get(NOTE_KEY)]
        return await super().save(model, path)


_WORDS = {"shipped": "shipped (no copy of yours)", "yours": "your copy",
          "outdated": "your copy; the chapter changed since (`make fresh N={n}` for the new one)",
          "stale": "your copy holds only outputs of an older version: the lab opens the new one"}


def describe(name: str, root: Path = REPO) -> str:
    """A chapter's line in the listing: whose copy the lab opens, and what to run if it is outdated."""
    return _WORDS[state(name, root)].format(n=chapter_number(name))


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="Your copies of the chapters (work/chapters/).")
    sub = parser.add_subparsers(dest="command")
    fresh = sub.add_parser("fresh", help="put your copy of a chapter aside; the lab then opens the shipped version")
    fresh.add_argument("chapter", help="chapter number (07) or notebook name (07_scheduler.ipynb, index)")
    args = parser.parse_args(argv)
    names = sorted(p.name for p in (REPO / "chapters").glob("*.ipynb") if is_chapter(p))
    if args.command == "fresh":
        wanted = [n for n in names if n == args.chapter or n.startswith(f"{args.chapter}_")
                  or n == f"{args.chapter}.ipynb"]
        if len(wanted) != 1:
            print(f"no single chapter matches {args.chapter!r}; chapters: {', '.join(names)}", file=sys.stderr)
            return 2
        dest = put_aside(wanted[0])
        print(f"{wanted[0]}: your copy is now {dest.relative_to(REPO)}; the lab opens the shipped chapter"
              if dest else f"{wanted[0]}: you have no copy; the lab already opens the shipped chapter")
        return 0
    for name in names:
        print(f"{name:32} {describe(name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
