#!/usr/bin/env python3
"""Refresh the stored outputs of `book.show(...)` and `book.files_added(...)` cells from the package as
it is now, without executing anything: what `tests/test_notebooks_fresh.py` recomputes, written back.

    python tools/refresh_shown.py            # every chapter
    python tools/refresh_shown.py 02 17      # only these

Use it after an edit that moves code only (a rename, a rewrapped line); after anything that changes what
a cell computes, re-execute the notebook instead.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHAPTERS = REPO / "chapters"


def _book():
    spec = importlib.util.spec_from_file_location("_book_refresh", CHAPTERS / "book.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def refresh(path: Path, book) -> int:
    nb = json.loads(path.read_text())
    changed = 0
    for cell in nb["cells"]:
        for out in cell.get("outputs", []) if cell["cell_type"] == "code" else []:
            meta = out.get("metadata", {})
            if "minisgl_show" in meta:
                obj = book.source(meta["minisgl_show"]["target"], meta["minisgl_show"]["chapter"])
            elif "minisgl_files_added" in meta:
                obj = book.files_added(meta["minisgl_files_added"]["chapter"])
            else:
                continue
            data, new_meta = obj._repr_mimebundle_()
            data = {k: v.splitlines(keepends=True) if isinstance(v, str) else v for k, v in data.items()}
            if data != out.get("data") or new_meta != meta:
                out["data"], out["metadata"] = data, new_meta
                changed += 1
    if changed:
        path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    return changed


def main() -> None:
    wanted = sys.argv[1:]
    book = _book()
    for path in sorted(CHAPTERS.glob("[0-9][0-9]_*.ipynb")):
        if not wanted or path.name[:2] in wanted:
            n = refresh(path, book)
            if n:
                print(f"{path.name}: {n} outputs refreshed")


if __name__ == "__main__":
    main()
