"""`%%judge <id>`: grade the code of a notebook cell as the learner's file for exercise <id>."""

from __future__ import annotations

import tempfile
from pathlib import Path


def _judge_cell(line: str, cell: str):
    from .grade import grade

    parts = line.split()
    if not parts:
        raise ValueError("usage: %%judge <exercise-id> [--seed N]")
    seed = int(parts[parts.index("--seed") + 1]) if "--seed" in parts else None
    with tempfile.TemporaryDirectory(prefix="judge-cell-") as tmp:
        path = Path(tmp) / f"{parts[0].replace('-', '_')}_cell.py"
        path.write_text(cell)
        return grade(parts[0], path, seed=seed)


def register(ipython) -> None:
    ipython.register_magic_function(_judge_cell, magic_kind="cell", magic_name="judge")


def load_ipython_extension(ipython) -> None:  # `%load_ext judge`
    register(ipython)
