"""Shared pytest set-up: the models folder and the `gpu` / `slow` markers."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


def models_dir() -> Path:
    """Folder filled by `tools/prepare_models.py` (git-ignored)."""
    return REPO_ROOT / "models"


@pytest.fixture(name="models_dir")
def models_dir_fixture() -> Path:
    return models_dir()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA device; skipped when none is present")
    config.addinivalue_line("markers", "slow: takes long; deselect with -m 'not slow'")


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not any(item.get_closest_marker("gpu") for item in items):
        return
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (none found)")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


# ---- shared fixtures of the chapter tests (oracles and builders live in tests/helpers.py) ----


@pytest.fixture(scope="session")
def hf_refs():
    """Hugging Face greedy generations, computed once per test session and shared by every test."""
    from helpers import ReferenceCache

    return ReferenceCache()
