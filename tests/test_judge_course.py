"""The judge for a course: a class graded in one command into one table and the formats course
infrastructure reads, hidden cases and points, and verdicts the graded code cannot forge.

Everything grades req-lengths, the cheapest exercise, with short limits."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from judge import cli, formats, grade, magic, progress, reference, registry, sandbox, submission, variants
from judge.result import Status

REPO = Path(__file__).resolve().parent.parent
EX = "req-lengths"
SOLUTION = variants.solution_file(EX)
STARTER = registry.folder(EX) / "starter.py"
WRONG = {v.name: variants.variant_file(EX, v.name) for v in variants.declared(EX)}
BODY = "        return self.device_len - self.cached_len"  # Req.extend_len in the answer


# ---- verdicts the graded code cannot forge ----------------------------------------------------------
FORGE_STATUS = '''import json as _json
_real_dumps = _json.dumps
def _dumps(obj, *a, **k):
    if isinstance(obj, dict) and obj.get("event") == "done":  # say "pass" in every way the worker could
        obj = dict(obj, completed=True, outcome="returned", kind="pass", status="pass", obs=[])
    if isinstance(obj, dict) and obj.get("event") == "fatal":
        obj = dict(obj, kind="pass", status="pass")
    return _real_dumps(obj, *a, **k)
_json.dumps = _dumps
'''

PATCH_COMPARISON = '''import judge.compare, judge.grade, judge.runner
judge.compare.first_difference = lambda *a, **k: None
judge.grade.decide = lambda *a, **k: ("pass", None)
judge.runner.failure_status = lambda *a, **k: "pass"
'''
PATCH_HARNESS = PATCH_COMPARISON + '''import judge.api
judge.api.Obs.eq = lambda self, label, value: None
judge.api.Obs.unchanged = lambda self, *a: None
'''

# reads the recorded reference and sends its observations in place of the case's own
COPY_REFERENCE = f'''import json as _json, pathlib as _pl
_real_dumps = _json.dumps
try:
    _rec = _json.loads((_pl.Path({str(REPO)!r}) / "judge" / "reference" / "{EX}.json").read_text())["cases"]
except OSError:
    _rec = None
_KEYS = {{}}
def _dumps(obj, *a, **k):
    if _rec is not None and isinstance(obj, dict) and obj.get("event") == "done" and obj.get("case") in _rec:
        obj = dict(obj, outcome="returned", kind=None, obs=_rec[obj["case"]])
    return _real_dumps(obj, *a, **k)
_json.dumps = _dumps
'''


def _wrong_with(tmp_path: Path, name: str, prefix: str) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(prefix + next(iter(WRONG.values())).read_text())
    return path


def test_a_wrong_answer_cannot_say_it_passes(tmp_path: Path) -> None:
    plain = grade(EX, next(iter(WRONG.values())), seed=1, save=False)
    assert not plain.ok
    for name, prefix in (("forge_status", FORGE_STATUS), ("patch_comparison", PATCH_COMPARISON), ("patch_harness", PATCH_HARNESS)):
        result = grade(EX, _wrong_with(tmp_path, name, prefix), seed=1, save=False)
        assert result.passed <= plain.passed and not result.ok, f"{name}:\n{result}"
    # the comparison the worker holds is not the one that decides: on a right answer, patching it changes nothing
    right = tmp_path / "right_patched.py"
    right.write_text(PATCH_COMPARISON + SOLUTION.read_text())
    assert grade(EX, right, seed=1, save=False).ok


def test_the_recorded_reference_is_out_of_the_graded_codes_reach(tmp_path: Path) -> None:
    result = grade(EX, _wrong_with(tmp_path, "copy_reference", COPY_REFERENCE), seed=1, save=False)
    fixed = [c for c in result.cases if c.seed is None]
    if sandbox.available():
        assert sum(c.passed for c in fixed) < len(fixed), str(result)
        assert not result.ok
    else:  # without Landlock the judge says the graded code ran unconfined
        assert any("no Landlock" in n for n in result.notes), str(result)


def test_a_worker_that_stops_itself_ends_promptly(tmp_path: Path) -> None:
    at_import = tmp_path / "stops.py"
    at_import.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGSTOP)\n" + SOLUTION.read_text())
    t0 = time.monotonic()
    result = grade(EX, at_import, seed=1, save=False)
    assert time.monotonic() - t0 < 30, str(result)
    assert result.cases[0].status == Status.ERROR and "stopped" in result.cases[0].message, str(result)
    in_case = tmp_path / "stops_in_case.py"
    in_case.write_text(SOLUTION.read_text().replace(BODY, "        if self.prompt_len == 10:\n            import os, signal\n"
                                                          "            os.kill(os.getpid(), signal.SIGSTOP)\n" + BODY))
    t0 = time.monotonic()
    result = grade(EX, in_case, seed=1, save=False)
    assert time.monotonic() - t0 < 40, str(result)
    by_name = {c.name: c for c in result.cases}
    assert by_name["a 10-token prompt prefilled in chunks of 4"].status == Status.ERROR, str(result)
    assert by_name["a 5-token prompt, prefill then 3 decode steps"].passed, str(result)


def test_the_progress_record_is_written_only_by_the_judge(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = tmp_path / "state"
    monkeypatch.setattr(registry, "STATE_DIR", state)
    state.mkdir()
    (state / "results.json").write_text(json.dumps({"base-op": {"passed": 1, "total": 8, "file": "work/base-op.py", "when": "then"}}))
    real_record = REPO / ".judge" / "results.json"
    real_before = real_record.read_bytes() if real_record.exists() else None
    fake = {i: {"passed": 11, "total": 11, "file": "x", "when": "now"} for i in registry.exercise_ids()}
    writer = tmp_path / "writes_record.py"
    writer.write_text(
        "import json\n"
        f"for _p in ({str(state / 'results.json')!r}, {str(real_record)!r}):\n"
        f"    try:\n        open(_p, 'w').write(json.dumps({fake!r}))\n    except OSError:\n        pass\n"
        + next(iter(WRONG.values())).read_text()
    )
    result = grade(EX, writer, seed=1)
    assert not result.ok
    record = progress.load()
    assert set(record) == {"base-op", EX}, record  # its own grading, and nothing the code wrote
    assert record[EX].latest.passed == result.passed and record["base-op"].best.passed == 1
    # confined, the graded code could not write it; unconfined, the judge put it back and says so
    assert any("progress record" in w for w in result.warnings) != sandbox.available(), str(result)
    assert (real_record.read_bytes() if real_record.exists() else None) == real_before


def test_a_grading_under_the_test_harness_leaves_the_learners_record_alone() -> None:
    """tests/conftest.py points the judge's state at a temporary folder through the environment:
    a fresh interpreter (a notebook's kernel, a `judge.py`) finds it there, and a grading saved
    under the harness goes there and leaves the repository's .judge/results.json as it was."""
    from file_module import load_file

    JUDGE_STATE_ENV = load_file(Path(__file__).resolve().parent / "conftest.py", "_tests_conftest").JUDGE_STATE_ENV

    assert JUDGE_STATE_ENV == registry.STATE_ENV
    harness = Path(os.environ[registry.STATE_ENV]).resolve()
    assert registry.STATE_DIR == harness and REPO not in harness.parents and progress.path().parent == harness
    kernel = subprocess.run([sys.executable, "-c", "from judge import progress; print(progress.path())"], cwd=REPO / "chapters",
                            env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True, timeout=120)
    assert kernel.returncode == 0 and Path(kernel.stdout.strip()) == harness / "results.json", kernel.stdout + kernel.stderr
    real_record = REPO / ".judge" / "results.json"
    before = (real_record.read_bytes(), real_record.stat().st_mtime_ns) if real_record.exists() else None
    result = grade(EX, SOLUTION, seed=2)  # saved, as `judge.py <id>` and a `%%judge` cell save
    assert result.ok, str(result)
    assert ((real_record.read_bytes(), real_record.stat().st_mtime_ns) if real_record.exists() else None) == before
    assert progress.load()[EX].best.passed == result.total  # the harness's record holds it


# ---- points and hidden cases ------------------------------------------------------------------------
HIDDEN_CASES = '''import random

import torch

from judge.api import Obs, case
from minisgl.core import Req, SamplingParams
from minisgl.kvcache import BaseCacheHandle


def _ledger(obs: Obs, prompt: int, max_tokens: int, chunk: int) -> None:
    req = Req(torch.arange(prompt, dtype=torch.int32), 0, 0, 0, SamplingParams(max_tokens=max_tokens), BaseCacheHandle(0))
    req.device_len = min(chunk, prompt)
    for step in range(prompt + max_tokens):
        obs.eq(f"pass {step}: extend_len, remain_len, is_chunk, can_decode", [req.extend_len, req.remain_len, req.is_chunk, req.can_decode])
        if req.remain_len == 0 and not req.is_chunk:
            break
        req.complete_one()
        if req.prompt_len - req.cached_len > chunk:
            req.device_len = req.cached_len + chunk


@case("hidden: a 7-token prompt in chunks of 3", weight=2)
def seven(obs: Obs) -> None:
    _ledger(obs, 7, 2, 3)


@case("hidden: random ledgers", seeds=[11, 42])
def fixed_seeds(obs: Obs, seed: int) -> None:
    rng = random.Random(seed)
    _ledger(obs, rng.randint(2, 30), rng.randint(1, 5), rng.randint(1, 8))
'''


def _hidden_dir(tmp_path: Path) -> Path:
    d = tmp_path / "instructor"
    (d / EX).mkdir(parents=True)
    (d / EX / "cases.py").write_text(HIDDEN_CASES)
    return d


def test_hidden_cases_are_graded_beside_the_public_ones_and_reported_apart(tmp_path: Path) -> None:
    cases_dir = _hidden_dir(tmp_path)
    result = grade(EX, SOLUTION, seed=1, save=False, cases_dir=cases_dir)
    hidden = result.part(True)
    assert result.ok and [c.name for c in hidden] == ["hidden: a 7-token prompt in chunks of 3", "hidden: random ledgers (seed 11)",
                                                      "hidden: random ledgers (seed 42)"], str(result)
    public_points = sum(registry.load(EX).weight_of(c) for c in registry.load(EX).cases)
    assert result.max_points == pytest.approx(public_points + 2 + 1)  # weight 2, and 1 shared by the two fixed seeds
    assert "hidden cases (the instructor's):" in str(result) and any("hidden case" in n for n in result.instructor_notes)
    wrong = grade(EX, next(iter(WRONG.values())), seed=1, save=False, cases_dir=cases_dir)
    assert len(wrong.part(True)) == 3 and not wrong.ok
    data = formats.gradescope(wrong)
    assert formats.gradescope_fields_ok(data) == []
    assert {t["visibility"] for t in data["tests"] if t["name"].startswith("[hidden]")} == {"after_published"}


def test_weights_are_declared_per_case(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from judge import declaration

    good = 'chapter = 1\ntitle = "t"\ndifficulty = 1\nreplaces = ["minisgl.core:Req.extend_len"]\n'
    folder = tmp_path / "exercises" / "w-ex"
    folder.mkdir(parents=True)
    (folder / "exercise.toml").write_text(good + "weights = { c = 3, d = 0.5 }\n")
    assert declaration.load(folder).weights == {"c": 3.0, "d": 0.5}
    (folder / "exercise.toml").write_text(good + "weights = { c = -1 }\n")
    with pytest.raises(declaration.DeclarationError, match="a weight is a positive number"):
        declaration.load(folder)
    (folder / "exercise.toml").write_text(good + "weights = { nosuch = 2 }\n")
    (folder / "cases.py").write_text("from judge.api import case\n\n@case('c')\ndef c(obs):\n    pass\n")
    monkeypatch.setattr(registry, "EXERCISES_DIR", tmp_path / "exercises")
    with pytest.raises(declaration.DeclarationError, match="'weights' names nosuch"):
        registry.load("w-ex")
    monkeypatch.undo()
    for ex_id in registry.exercise_ids():
        ex = registry.load(ex_id)
        assert set(ex.weights) <= {c.key for c in ex.cases}


# ---- the standard outputs ---------------------------------------------------------------------------
def test_gradescope_and_junit_from_grade(tmp_path: Path, capsys) -> None:
    gs, ju = tmp_path / "results.json", tmp_path / "junit.xml"
    code = cli.main(["grade", EX, "--file", str(WRONG[next(iter(WRONG))]), "--seed", "1", "--no-record",
                     "--gradescope", str(gs), "--junit", str(ju)])
    assert code == 1
    data = json.loads(gs.read_text())
    assert formats.gradescope_fields_ok(data) == []
    assert data["tests"] and all({"name", "score", "max_score", "output", "visibility"} <= set(t) for t in data["tests"])
    assert all(isinstance(t["score"], (int, float)) and 0 <= t["score"] <= t["max_score"] for t in data["tests"])
    assert data["score"] == pytest.approx(sum(t["score"] for t in data["tests"])) and data["score"] < sum(t["max_score"] for t in data["tests"])
    suite = ET.parse(ju).getroot().find("testsuite")
    assert int(suite.get("tests")) == len(data["tests"]) and int(suite.get("failures")) + int(suite.get("errors")) >= 1
    # nothing to grade: still a results.json, a zero saying why
    empty = tmp_path / "empty_submission"
    empty.mkdir()
    assert cli.main(["grade", EX, "--file", str(empty), "--gradescope", str(gs)]) == 2
    data = json.loads(gs.read_text())
    assert data["score"] == 0 and "no req-lengths.py" in data["output"] and formats.gradescope_fields_ok(data) == []


def test_run_autograder_writes_results(tmp_path: Path) -> None:
    root = tmp_path / "autograder"
    (root / "submission").mkdir(parents=True)
    (root / "submission" / f"{EX}.py").write_text(SOLUTION.read_text())
    env = dict(os.environ, EXERCISE=EX, AUTOGRADER_ROOT=str(root), WORKBOOK=str(REPO), PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    proc = subprocess.run(["bash", str(REPO / "judge" / "autograder" / "run_autograder")], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads((root / "results" / "results.json").read_text())
    assert formats.gradescope_fields_ok(data) == [] and data["tests"]
    assert all(t["status"] == "passed" for t in data["tests"]), data
    assert ET.parse(root / "results" / "junit.xml").getroot().tag == "testsuites"


# ---- a class in one command ---------------------------------------------------------------------------
def _notebook(cell: str) -> str:
    return json.dumps({"cells": [{"cell_type": "markdown", "metadata": {}, "source": ["# my chapter\n"]},
                                 {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                                  "source": [f"%%judge {EX}\n", cell]}],
                       "metadata": {}, "nbformat": 4, "nbformat_minor": 5})


def test_grade_all_grades_a_class(tmp_path: Path, capsys) -> None:
    subs = tmp_path / "submissions"
    files = {"ada": SOLUTION.read_text(), "bob": STARTER.read_text(),
             "hang": SOLUTION.read_text().replace(BODY, "        while self.prompt_len == 10:\n            pass\n" + BODY),
             "crash": "import os\nos._exit(3)\n" + SOLUTION.read_text(),
             # a fork bomb, bounded: every process forks, eight times over (256), and the copies sleep;
             # the first one waits too, so the bomb stands while its cases would run, however busy the machine
             "forks": "import os, time\n_main = os.getpid()\nfor _ in range(8):\n    os.fork()\n"
                      "if os.getpid() != _main:\n    time.sleep(600)\n    os._exit(0)\ntime.sleep(5)\n" + SOLUTION.read_text()}
    files.update({f"wrong-{name}": path.read_text() for name, path in WRONG.items()})
    for learner, text in files.items():
        (subs / learner).mkdir(parents=True)
        (subs / learner / f"{EX}.py").write_text(text)
    (subs / "nora").mkdir()
    (subs / "nora" / "10_chunked_prefill.ipynb").write_text(_notebook(SOLUTION.read_text()))
    (subs / "missing").mkdir()
    (subs / "garbled").mkdir()
    (subs / "garbled" / "01_core.ipynb").write_text("{ not json")
    record_before = progress.snapshot()
    out = tmp_path / "grades"
    code = cli.main(["grade-all", str(subs), "--exercise", EX, "--jobs", "2", "--seed", "3", "--timeout-scale", "0.2", "--out", str(out)])
    assert code == 0
    assert progress.snapshot() == record_before  # a course's gradings are not a learner's progress
    rows = list(csv.DictReader(open(out / "grades.csv")))
    by = {}
    for r in rows:
        by.setdefault(r["learner"], []).append(r)
    assert set(by) == set(files) | {"nora", "missing", "garbled"}
    n_cases = len(by["ada"])
    assert all(r["verdict"] == "pass" for r in by["ada"]) and all(r["verdict"] == "pass" for r in by["nora"])
    assert by["nora"][0]["submission"].endswith("10_chunked_prefill.ipynb")
    assert not any(r["verdict"] == "pass" for r in by["bob"]) and len(by["bob"]) == n_cases
    for name in WRONG:
        assert any(r["verdict"] != "pass" for r in by[f"wrong-{name}"]), (name, by[f"wrong-{name}"])
    assert "timeout" in {r["verdict"] for r in by["hang"]} and any(r["verdict"] == "pass" for r in by["hang"])
    assert {r["verdict"] for r in by["crash"]} <= {"error", "not run"} and by["crash"][0]["verdict"] == "error"
    assert any(r["verdict"] == "error" and "fork bomb" in r["reason"] for r in by["forks"]), by["forks"]
    assert [(r["verdict"], r["score"]) for r in by["missing"]] == [("missing", "0.0")] and "no req-lengths.py" in by["missing"][0]["reason"]
    assert by["garbled"][0]["verdict"] == "unreadable" and "not a readable notebook" in by["garbled"][0]["reason"]
    assert all(float(r["max_score"]) > 0 and float(r["seconds"]) >= 0 for r in rows)
    table = json.loads((out / "grades.json").read_text())
    assert table["seed"] == 3 and len(table["rows"]) == len(rows)
    summary = {s["learner"]: s for s in table["learners"]}
    assert summary["ada"]["points"] == summary["ada"]["max_points"] and summary["bob"]["points"] == 0
    suites = ET.parse(out / "junit.xml").getroot().findall("testsuite")
    assert {s.get("name") for s in suites} == set(by)
    for learner in by:
        data = json.loads((out / "gradescope" / learner / "results.json").read_text())
        assert formats.gradescope_fields_ok(data) == []


# ---- the learner's loop: an untouched starter is not an attempt; the machine note ---------------------
def test_an_untouched_starter_cell_is_not_graded_or_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from IPython.core.interactiveshell import InteractiveShell

    monkeypatch.setattr(registry, "STATE_DIR", tmp_path)
    shell = InteractiveShell.instance()
    magic.register(shell)
    for ex_id in registry.exercise_ids():  # every exercise's starter reads as not started
        out = shell.run_cell_magic("judge", ex_id, (registry.folder(ex_id) / "starter.py").read_text())
        assert isinstance(out, magic.NotStarted) and "not started" in str(out), ex_id
    assert progress.load() == {}
    assert not submission.untouched(SOLUTION.read_text(), registry.declared(EX).replaces)
    half = STARTER.read_text().replace('raise NotImplementedError("req-lengths: write Req.extend_len")', "return 0")
    assert half != STARTER.read_text() and not submission.untouched(half, registry.declared(EX).replaces)


def test_the_progress_cell_runs_alone_in_a_fresh_kernel() -> None:
    nb = json.loads((REPO / "chapters" / "index.ipynb").read_text())
    cell = next(c for c in nb["cells"] if c["cell_type"] == "code" and "contents.progress()" in "".join(c["source"]))
    code = "".join(cell["source"]).replace("contents.progress()", "print(contents.progress().data)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO / "chapters", capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| Exercise |" in proc.stdout


def test_the_machine_note_names_what_differs(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = {"device": "cpu", "python": "3.11", "torch": "2.13.0+cpu", "transformers": "5.24.0"}
    assert reference.differences(rec, dict(rec, python="3.12")) == []  # Python's version changes no observation
    assert reference.differences(rec, dict(rec, transformers="5.25.0")) == ["transformers 5.25.0 here, 5.24.0 recorded"]
    assert reference.differences(rec, dict(rec, device="cuda (NVIDIA H200)", torch="2.13.0")) == [
        "cuda (NVIDIA H200) here, cpu recorded", "torch 2.13.0 here, 2.13.0+cpu recorded"]
    import importlib

    grade_module = importlib.import_module("judge.grade")
    recorded = reference.load(EX)["fingerprint"]
    monkeypatch.setattr(grade_module, "current_fingerprint", lambda: dict(recorded, python="3.99"))
    result = grade(EX, SOLUTION, seed=1, save=False)
    assert result.ok and any("compared with the recorded reference outputs" in n for n in result.notes), str(result)
    monkeypatch.setattr(grade_module, "current_fingerprint", lambda: dict(recorded, transformers="0.0.1"))
    result = grade(EX, SOLUTION, seed=1, save=False)
    note = next(n for n in result.notes if "recomputed" in n)
    assert f"transformers 0.0.1 here, {recorded['transformers']} recorded" in note and "python" not in note.lower()


def test_a_new_fork_server_leaves_running_gradings_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the engine's files change while a grading runs: the next
    # worker comes from a new fork server, and the running grading is not killed with the old one
    from concurrent.futures import ThreadPoolExecutor

    from judge import runner

    marker = tmp_path / "slow case running"
    slow = tmp_path / "slow.py"
    slow.write_text(SOLUTION.read_text().replace(BODY, f"        import os, time\n        if self.prompt_len == 10 and not os.path.exists({str(marker)!r}):\n"
                                                       f"            open({str(marker)!r}, 'w').close()\n            time.sleep(5)\n" + BODY))
    stamp = {"now": 0.0}
    monkeypatch.setattr(runner.Zygote, "_sources_stamp", staticmethod(lambda: stamp["now"]))
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(grade, EX, slow, seed=1, save=False)
        deadline = time.monotonic() + 120
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.exists(), "the slow case never started"
        stamp["now"] = 1.0
        second = pool.submit(grade, EX, SOLUTION, seed=1, save=False)
        a, b = first.result(), second.result()
    assert a.ok, str(a)
    assert b.ok, str(b)
