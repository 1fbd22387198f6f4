"""Writing a file that other processes may be reading at the same moment."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Union


def write_whole(path: Union[str, Path], text: str) -> None:
    """Write `text` to `path` so that a reader sees the old file or the new one, never half of one:
    through a temporary file of this writer's own, renamed over `path` (atomic on one file system)."""
    folder, name = os.path.split(os.fspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder or ".", prefix=f".{name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)
