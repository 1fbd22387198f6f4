"""The test suite runs every chapter through nbval (`--nbval-lax`: only cells tagged
`nbval-check-output` must reproduce their saved outputs). This plugin compares the other code cells
too, on the outputs nbval has just produced, so that no saved output goes stale and no notebook is
executed twice: the comparison is `tools/stale_outputs.py`'s (text outputs after the replacements
of `nbval_sanitize.cfg`; images, `nbval-skip` and `nbval-ignore-output` cells left out).

A stale cell fails its test, except in the notebooks of `NOT_YET_REFRESHED`, whose stale cells
are reported as warnings until the notebook is re-executed on a quiet machine and saved
(`python tools/stale_outputs.py NN --write`) and taken off the list. The chapters are saved from a
CPU run, so on a machine with an NVIDIA GPU (where they take their GPU paths) nothing is compared;
but for the cells tagged `gpu`, which need CUDA and are saved from a GPU run
(`tools/gpu_outputs.py`): on a machine without a GPU those are run (they print "not run here")
and not compared. nbval does not compare them either, since it runs lax and they are not tagged
`nbval-check-output`.
"""

from __future__ import annotations

import importlib.util
import sys
import warnings
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

# Notebooks whose saved outputs have not been refreshed since this check came in: their stale cells
# warn instead of failing. Remove a notebook once it is re-executed and saved.
NOT_YET_REFRESHED = frozenset({})  # empty: every chapter is refreshed


class StaleOutputWarning(UserWarning):
    """A saved output that a fresh run no longer gives, in a notebook not yet refreshed."""


class StaleOutputError(Exception):
    """A saved output that a fresh run no longer gives."""


def _stale_outputs():
    module = sys.modules.get("_stale_outputs")
    if module is None:
        spec = importlib.util.spec_from_file_location("_stale_outputs", HERE.parent / "tools" / "stale_outputs.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return module


def _ends_quiet(cell) -> bool:
    """Whether a cell ends with `;`, which tells Jupyter not to display its last value."""
    source = cell.get("source", "")
    lines = [ln.split("#")[0].rstrip() for ln in ("".join(source) if isinstance(source, list) else source).splitlines()]
    lines = [ln for ln in lines if ln]
    return bool(lines) and lines[-1].endswith(";")


@pytest.hookimpl(trylast=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    """After nbval has run a cell (and compared it, if tagged): compare the rest."""
    cell, fresh = getattr(item, "cell", None), getattr(item, "test_outputs", None)
    options = getattr(item, "options", None)
    if cell is None or fresh is None or options is None or options.get("check"):
        return  # not a notebook cell, or nbval compared it already
    so = _stale_outputs()
    if so.ON_GPU_MACHINE or not so.checked(cell):
        return  # outputs saved on a CPU cannot apply here; or not compared at all (a `gpu` cell on a CPU)
    patterns = list(item.parent.sanitize_patterns.items()) or so.load_patterns()
    if _ends_quiet(cell):  # nbval's kernel displays it anyway (no history): Jupyter would not
        fresh = [out for out in fresh if out.get("output_type") != "execute_result"]
    diff = so.first_difference(so.comparable(cell.get("outputs", []), patterns), so.comparable(fresh, patterns))
    if diff is None:
        return
    name = Path(str(item.fspath)).name
    how = f"python tools/stale_outputs.py {name[:2]} --write" if name[:2].isdigit() else "run it and save it"
    message = (f"{name}, {item.name}: the saved output is stale ({diff}); re-execute the notebook and save it "
               f"({how}), or tag the cell nbval-ignore-output if its output depends on the machine or the "
               "learner by design")
    if name in NOT_YET_REFRESHED:
        warnings.warn(StaleOutputWarning(message))
    else:
        raise StaleOutputError(message)
