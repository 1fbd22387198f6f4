"""Small helpers shared by every stage."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import torch


def div_ceil(a: int, b: int) -> int:
    return -(-a // b)


def align_down(a: int, b: int) -> int:
    return a // b * b


def align_up(a: int, b: int) -> int:
    return div_ceil(a, b) * b


def package_has(module: str) -> bool:
    """Is `module` (e.g. "minisgl.engine.graph") part of the package being run?

    A staged build of the package (the package as of chapter N) holds only the files its
    chapters introduced, so every "auto" choice (attention backend, CUDA graphs) asks this before
    reaching for a module a later chapter brings in, instead of failing with ModuleNotFoundError.
    """
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing too
        return False


def default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


REPO_ROOT = Path(__file__).resolve().parents[2]


def default_model_path() -> Path:
    """The bundled SmolLM2 model prepared by `tools/prepare_models.py`, unless MINISGL_MODEL says otherwise."""
    override = os.environ.get("MINISGL_MODEL")
    if override:
        return Path(override)
    return REPO_ROOT / "models" / "smollm2-135m-instruct"
