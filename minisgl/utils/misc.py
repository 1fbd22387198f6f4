"""Small helpers shared by every stage."""

from __future__ import annotations

import os
from pathlib import Path

import torch


def div_ceil(a: int, b: int) -> int:
    return -(-a // b)


def align_down(a: int, b: int) -> int:
    return a // b * b


def align_up(a: int, b: int) -> int:
    return div_ceil(a, b) * b


def default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


REPO_ROOT = Path(__file__).resolve().parents[2]


def default_model_path() -> Path:
    """The bundled SmolLM2 model prepared by `tools/prepare_models.py`, unless MINISGL_MODEL says otherwise."""
    override = os.environ.get("MINISGL_MODEL")
    if override:
        return Path(override)
    return REPO_ROOT / "models" / "smollm2-135m-instruct"
