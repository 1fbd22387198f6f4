"""Shared pytest set-up: the models folder, the `gpu` / `slow` markers, and how the suite is spread
over pytest-xdist workers (`make test` runs `-n <cores> --dist loadfile`)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tools.workbook_env import WORKBOOK

REPO_ROOT = Path(__file__).resolve().parent.parent

# Under pytest-xdist the cores are shared out between the workers: torch's default of one thread a
# core in every worker (and in the servers and kernels they start) oversubscribes them, and its
# threads spin while they wait. Set before torch is imported; an explicit OMP_NUM_THREADS wins.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    _CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, _CORES // _WORKERS)))

# The judge's state (the learner's progress record, the files `judge.py check` generates) lives in a
# temporary folder for the whole run, so the suite never touches a learner's .judge/results.json.
# Set before the judge is imported (it reads the variable, judge.registry.STATE_ENV, then); the xdist
# workers, the notebooks' kernels and every `judge.py` the tests start inherit it.
JUDGE_STATE_ENV = "JUDGE_STATE_DIR"
_OWN_JUDGE_STATE = JUDGE_STATE_ENV not in os.environ
if _OWN_JUDGE_STATE:
    os.environ[JUDGE_STATE_ENV] = tempfile.mkdtemp(prefix="minisgl-judge-state-")


# Transformers' greedy runs (the `hf_refs` oracle), shared by the xdist workers through one folder
# for the run, so a reference two test files need is computed once; removed with the judge's folder.
REFERENCE_DIR_ENV = "MINISGL_TEST_REFERENCE_DIR"
if _OWN_JUDGE_STATE and REFERENCE_DIR_ENV not in os.environ:
    os.environ[REFERENCE_DIR_ENV] = os.path.join(os.environ[JUDGE_STATE_ENV], "hf-references")
    os.makedirs(os.environ[REFERENCE_DIR_ENV])


def models_dir() -> Path:
    """Folder filled by `tools/prepare_models.py` (git-ignored)."""
    return REPO_ROOT / "models"


@pytest.fixture(name="models_dir")
def models_dir_fixture() -> Path:
    return models_dir()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA device; skipped when none is present")
    config.addinivalue_line("markers", "slow: takes long; deselect with -m 'not slow'")


def pytest_unconfigure(config: pytest.Config) -> None:
    if _OWN_JUDGE_STATE:  # the process that made the judge's temporary folder removes it
        shutil.rmtree(os.environ[JUDGE_STATE_ENV], ignore_errors=True)


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


# How `make test` spreads the suite over pytest-xdist workers (`-n <cores> --dist loadfile`): a test
# file runs whole on one worker, so its module fixtures (servers, engines) are built once, and so
# does a notebook (its cells share one kernel). The files below hold long tests that share nothing
# (no module fixture, nothing on disk): their tests are handed out one by one, and first.
SPREAD_FILES = {"test_judge.py"}

# Seconds each file took in a full run (setup, call and teardown of its tests summed), so the longest
# start first and none is left running alone at the end. Only the order depends on it: a stale or
# missing entry costs time, never a test. Rewritten by a run with MINISGL_RECORD_FILE_SECONDS=1.
FILE_SECONDS = Path(__file__).resolve().parent / "file_seconds.json"
_UNRECORDED_ITEM_SECONDS = 1.0  # a file run since the last recording: a guess from its item count
_recorded_seconds: dict[str, float] = {}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SpreadLongFiles(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return nodeid if Path(scope).name in SPREAD_FILES else scope

    config.option.loadscopereorder = False  # the workers' collection is in the order wanted (below)
    return SpreadLongFiles(config, log)


def _file_key(nodeid: str) -> str:
    return nodeid.split("::")[0]  # tests/test_x.py, chapters/NN_x.ipynb


def _heaviest_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """Whole files in the order xdist hands them out: the spread files' tests, then the files and
    notebooks that took longest in the recorded run, so no long one comes last."""
    try:
        seconds = json.loads(FILE_SECONDS.read_text())
    except (OSError, ValueError):
        seconds = {}
    files: dict[str, list[pytest.Item]] = {}
    for item in items:
        files.setdefault(_file_key(item.nodeid), []).append(item)

    def weight(name: str) -> tuple[bool, float]:
        guess = len(files[name]) * _UNRECORDED_ITEM_SECONDS
        return Path(name).name not in SPREAD_FILES, -seconds.get(name, guess)

    return [item for name in sorted(files, key=weight) for item in files[name]]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker: every worker sorts the same way
        items[:] = _heaviest_first(items)
    if not any(item.get_closest_marker("gpu") for item in items):
        return
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (none found)")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if WORKBOOK.record_file_seconds:  # the controller, under xdist, sees every report
        key = _file_key(report.nodeid)
        _recorded_seconds[key] = _recorded_seconds.get(key, 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    if not WORKBOOK.record_file_seconds or hasattr(session.config, "workerinput") or not _recorded_seconds:
        return
    try:  # a run of some files updates theirs; files no longer there are dropped
        recorded = json.loads(FILE_SECONDS.read_text())
    except (OSError, ValueError):
        recorded = {}
    recorded.update(_recorded_seconds)
    kept = {name: round(s, 1) for name, s in sorted(recorded.items()) if (REPO_ROOT / name).is_file()}
    FILE_SECONDS.write_text(json.dumps(kept, indent=1) + "\n")


def pytest_sessionstart(session: pytest.Session) -> None:
    """Once, before any xdist worker starts: build every chapter's staged package (.stages/), so
    two workers never rebuild the same stage under each other (a notebook and tests/test_stages.py)."""
    if hasattr(session.config, "workerinput"):
        return  # a worker: the controller has built them
    from file_module import load_file

    stages = load_file(REPO_ROOT / "tools" / "stages.py", "_stages_for_the_session")
    manifest = stages.load_manifest()
    for notebook in sorted((REPO_ROOT / "chapters").glob("[0-9][0-9]_*.ipynb")):
        if int(notebook.name[:2]) >= 1:  # chapter 0 runs without a stage
            stages.build(int(notebook.name[:2]), manifest)


# ---- shared fixtures of the chapter tests (oracles and builders live in tests/helpers.py) ----


@pytest.fixture(scope="session")
def hf_refs():
    """Hugging Face greedy generations, computed once per test session and shared by every test."""
    from helpers import ReferenceCache

    folder = os.environ.get(REFERENCE_DIR_ENV)
    return ReferenceCache(Path(folder) if folder else None)
