"""Load a repository file that belongs to no package (chapters/book.py, tools/*.py) as a module of
its own, under a private name, so a test reads that very file and not a same-named module some
other test or notebook put on sys.path."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_file(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before running it: dataclasses and pickling look the module up
    spec.loader.exec_module(module)
    return module
