"""Environment switches, read once. Each is `MINISGL_<NAME>`; the default is the fast path."""

from __future__ import annotations

import os
from dataclasses import dataclass


def _flag(name: str, default: bool) -> bool:
    value = os.environ.get(f"MINISGL_{name}")
    if value is None:
        return default
    return value.strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class EnvSwitches:
    disable_overlap: bool = _flag("DISABLE_OVERLAP", False)
    disable_cuda_graph: bool = _flag("DISABLE_CUDA_GRAPH", False)
    check_integrity: bool = _flag("CHECK_INTEGRITY", False)  # expensive checks after every step
    model: str = os.environ.get("MINISGL_MODEL", "")


ENV = EnvSwitches()
