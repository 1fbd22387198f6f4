"""Writing files where another process may be reading, or may have planted a name."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Union


def write_whole(path: Union[str, Path], data: Union[str, bytes]) -> None:
    """Write `data` to `path` so that a reader sees the old file or the new one, never half of one:
    through a temporary file of this writer's own, renamed over `path` (atomic on one file system).
    A link found at `path` is replaced, never followed."""
    folder, name = os.path.split(os.fspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder or ".", prefix=f".{name}.", suffix=".tmp")
    os.fchmod(fd, 0o644)  # as an ordinary write would leave it (mkstemp's is 0600)
    with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)
    os.replace(tmp, path)


def create_new(path: Union[str, Path], text: str = "") -> None:
    """Create `path`, which must not exist yet, with `text`, readable by its owner only. Never
    follows a link: a name someone planted makes this fail instead of writing elsewhere."""
    fd = os.open(os.fspath(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
