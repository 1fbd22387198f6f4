#!/usr/bin/env python3
"""Give every notebook in chapters/ the kernel metadata that JupyterLab writes itself.

JupyterLab replaces a notebook's `kernelspec` with the running kernel's as soon as it opens the
notebook; when the stored one differs ("Python 3" against "Python 3 (ipykernel)") the notebook is
marked modified and autosave rewrites it, so a reader's git tree goes dirty without a cell run.

    python tools/notebook_metadata.py          # rewrite the notebooks that differ (metadata only)
    python tools/notebook_metadata.py --check  # list them and exit 1 (the tests do this)

Only `metadata.kernelspec` and the fixed fields of `metadata.language_info` are touched: cells,
outputs and widget state stay as they are, and nothing is executed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Dict, List

import nbformat

REPO = Path(__file__).resolve().parents[1]
CHAPTERS = REPO / "chapters"

# What ipykernel's kernel.json ("python3") declares, and the language_info its kernel reports;
# `version` is the interpreter's own and is left to whoever last executed the notebook.
KERNELSPEC: Dict[str, str] = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
LANGUAGE_INFO: Dict[str, Any] = {
    "codemirror_mode": {"name": "ipython", "version": 3},
    "file_extension": ".py",
    "mimetype": "text/x-python",
    "name": "python",
    "nbconvert_exporter": "python",
    "pygments_lexer": "ipython3",
}


def notebooks() -> List[Path]:
    return sorted(CHAPTERS.glob("*.ipynb"))


def problems(nb: nbformat.NotebookNode) -> List[str]:
    """What differs from the metadata the lab writes; empty when the notebook is fine."""
    out = []
    spec = dict(nb.metadata.get("kernelspec", {}))
    if spec != KERNELSPEC:
        out.append(f"kernelspec is {spec}, the lab writes {KERNELSPEC}")
    info = nb.metadata.get("language_info", {})
    for key, value in LANGUAGE_INFO.items():
        if info.get(key) != value:
            out.append(f"language_info.{key} is {info.get(key)!r}, the kernel reports {value!r}")
    return out


def normalize(nb: nbformat.NotebookNode) -> None:
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    info = nb.metadata.setdefault("language_info", {})
    info.update({k: v for k, v in LANGUAGE_INFO.items()})


def main(argv: List[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="only report notebooks that differ")
    p.add_argument("paths", nargs="*", type=Path, help="notebooks (default: chapters/*.ipynb)")
    args = p.parse_args(argv)
    bad = 0
    for path in args.paths or notebooks():
        nb = nbformat.read(path, as_version=4)
        found = problems(nb)
        if not found:
            continue
        bad += 1
        if args.check:
            print(f"{path}: " + "; ".join(found))
        else:
            normalize(nb)
            nbformat.write(nb, path)
            print(f"{path}: kernel metadata set")
    return 1 if args.check and bad else 0


if __name__ == "__main__":
    sys.exit(main())
