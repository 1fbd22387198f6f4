"""The workbook's own environment variables, for its chapters, tests and judge; the engine's are in
`minisgl/env.py`. Declared once with their meaning and read the same way, with the checkout's
`env.py` loaded by path: the staged packages of the first chapters predate it."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]


def _engine_env() -> ModuleType:
    name = "_minisgl_env"  # the checkout's env.py, whichever stage `minisgl` resolves to
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "minisgl" / "env.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


_env = _engine_env()
switch = _env.switch


@dataclass(frozen=True)
class WorkbookSwitches:
    num_threads: int = field(default=1, metadata=switch("CPU threads a chapter notebook gives torch"))
    judge_fork: bool = field(default=True, metadata=switch("the judge forks its workers from a preloaded process (0: "
                                                           "a fresh interpreter each)"))
    test_device: str = field(default="cpu", metadata=switch("device the test suite runs the engine on"))
    test_dtype: str = field(default="float32", metadata=switch("dtype the test suite runs the engine in"))
    test_attention: str = field(default="torch", metadata=switch("attention backend the test suite uses"))
    test_oracle: str = field(default="", metadata=switch("'recompute': the tests recompute transformers' outputs "
                                                         "instead of reading the recorded ones"))
    record_file_seconds: bool = field(default=False, metadata=switch("a test run rewrites tests/file_seconds.json "
                                                                     "with the seconds each of its files took"))


WORKBOOK = _env.read_switches(WorkbookSwitches)

