"""The judge: its own check over every exercise, and its verdicts on learner code that crashes,
loops, runs out of memory, mutates its inputs or reaches for the reference."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from judge import api, grade, install, registry, variants
from judge.compare import first_difference
from judge.result import GradeResult

REPO = Path(__file__).resolve().parent.parent
SOLUTION = variants.solution_file("req-lengths")  # the engine's own code in the starter's shape


def _variant(tmp_path: Path, name: str, old: str, new: str, source: Path = SOLUTION) -> Path:
    text = source.read_text()
    assert old in text, f"{old!r} not in {source}"
    path = tmp_path / f"{name}.py"
    path.write_text(text.replace(old, new))
    return path


def _statuses(result: GradeResult) -> dict:
    return {c.name.split(" (seed")[0]: c.status for c in result.cases}


# ---- the maintainers' check: reference passes, starters and wrong variants fail ---------------
def test_check_every_exercise() -> None:
    proc = subprocess.run([sys.executable, "judge.py", "check"], cwd=REPO, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert "all exercises check out" in proc.stdout


# ---- verdicts ------------------------------------------------------------------------------
def test_solution_passes_and_result_renders() -> None:
    result = grade("req-lengths", SOLUTION, save=False)
    assert result.ok and result.total >= 6, str(result)
    assert any("graded on" in n for n in result.notes)
    html = result._repr_html_()
    assert "<table>" in html and f"{result.total}/{result.total} cases pass" in html


def test_fresh_interpreter_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    # the path a GPU machine takes (no fork server): each worker is a new interpreter
    from judge import runner

    monkeypatch.setattr(runner, "USE_ZYGOTE", False)
    result = grade("req-lengths", SOLUTION, seed=6, save=False)
    assert result.ok, str(result)
    # a fresh worker imports the engine as the fork server does: SamplingParams carries chapter 13's
    # fields in both, so message-serde's observations match the recording made with a fork server
    result = grade("message-serde", variants.solution_file("message-serde"), seed=1, save=False)
    assert result.ok and any("compared with the recorded reference outputs" in n for n in result.notes), str(result)


def test_wrong_answer_reports_first_difference(tmp_path: Path) -> None:
    path = _variant(tmp_path, "no_chunk", "        if self.is_chunk:\n", "        if False:\n")
    result = grade("req-lengths", path, seed=5, save=False)
    bad = result.first_failure()
    assert bad is not None and bad.status == "fail"
    assert bad.where.startswith("after pass") and bad.got != bad.expected
    assert "python judge.py hint req-lengths" in str(result)


def test_crash_loop_and_memory_are_contained(tmp_path: Path) -> None:
    # each misbehaves only on 10-token prompts, so the other cases show grading goes on
    body = "        return self.device_len - self.cached_len"
    crash = _variant(tmp_path, "crash", body, "        if self.prompt_len == 10:\n            import os; os._exit(3)\n" + body)
    loop = _variant(tmp_path, "loop", body, "        while self.prompt_len == 10:\n            pass\n" + body)
    huge = _variant(tmp_path, "huge", body, "        if self.prompt_len == 10:\n            import torch; torch.ones(2**40, dtype=torch.uint8)\n" + body)
    # a CUDA process starts large, so there the limit (and the runaway allocation) is larger
    import torch

    limit_gb = 6.0 if torch.cuda.is_available() else 1.0
    hog = int((limit_gb + 0.5) * 1024)
    grow = _variant(tmp_path, "grow", body, f"        if self.prompt_len == 10:\n            import torch; self._hog = torch.ones({hog} * 2**20, dtype=torch.uint8)\n" + body)
    key = "a 10-token prompt prefilled in chunks of 4"
    for path, expected in ((crash, "error"), (loop, "timeout"), (huge, "oom"), (grow, "oom")):
        # a short limit for the endless loop; the memory cases get the usual time, since filling
        # gigabytes on a loaded machine can take longer than the short limit
        scale = 0.1 if expected == "timeout" else 1.0
        result = grade("req-lengths", path, seed=1, save=False, timeout_scale=scale, memory_limit_gb=limit_gb)
        statuses = _statuses(result)
        assert statuses[key] == expected, str(result)
        assert statuses["a 5-token prompt, prefill then 3 decode steps"] == "pass", str(result)


def test_threads_left_running_do_not_hang(tmp_path: Path) -> None:
    body = "        return self.device_len - self.cached_len"
    path = _variant(tmp_path, "thread", body, "        import threading, time\n        threading.Thread(target=time.sleep, args=(10**6,)).start()\n" + body)
    assert grade("req-lengths", path, seed=1, save=False).ok


def test_mutated_input_fails(tmp_path: Path) -> None:
    sampler = variants.solution_file("batched-sampler")
    path = _variant(tmp_path, "in_place", "        greedy = logits.argmax(dim=-1)\n", "        logits.mul_(1.0000001)\n        greedy = logits.argmax(dim=-1)\n", sampler)
    result = grade("batched-sampler", path, seed=2, save=False)
    bad = result.first_failure()
    assert bad is not None and bad.status == "fail" and "left unchanged" in bad.where and bad.got.startswith("changed")


def test_reaching_for_the_reference_is_rejected(tmp_path: Path) -> None:
    static = _variant(tmp_path, "static", "        return self.device_len - self.cached_len", "        return super().extend_len")
    result = grade("req-lengths", static, seed=1, save=False)
    assert result.cases[0].status == "rejected" and "super().extend_len" in result.cases[0].message
    assert {c.status for c in result.cases[1:]} == {"not run"}
    sneaky = _variant(tmp_path, "sneaky", "class Req(EngineReq):", "_REF = getattr(EngineReq, 'complete' + '_one')\n\n\nclass Req(EngineReq):")
    sneaky.write_text(sneaky.read_text().replace("        if self.is_chunk:\n", "        if self.is_chunk:\n            return _REF(self)\n"))
    result = grade("req-lengths", sneaky, seed=1, save=False)
    assert "rejected" in {c.status for c in result.cases}, str(result)
    assert any("engine's own Req.complete_one" in c.message for c in result.cases)
    borrowed = tmp_path / "borrowed.py"  # an exercise's own file, loaded under another name
    borrowed.write_text(
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('ref_copy', '/'.join([{str(REPO)!r}, 'exer' + 'cises', 'req-lengths', 'star' + 'ter.py']))\n"
        "mod = importlib.util.module_from_spec(spec)\nsys.modules['ref_copy'] = mod\nspec.loader.exec_module(mod)\nReq = mod.Req\n"
    )
    result = grade("req-lengths", borrowed, seed=1, save=False)
    assert result.cases[0].status == "rejected" and "exercises/req-lengths/starter.py" in result.cases[0].message


def test_load_errors_are_reported(tmp_path: Path) -> None:
    broken = _variant(tmp_path, "broken", "    def complete_one(self) -> None:", "    def complete_one(self) -> None")
    result = grade("req-lengths", broken, seed=1, save=False)
    assert result.passed == 0 and "SyntaxError" in result.cases[0].message and "line" in result.cases[0].message
    missing = _variant(tmp_path, "missing", "    def complete_one(self) -> None:", "    def complete_two(self) -> None:")
    result = grade("req-lengths", missing, seed=1, save=False)
    assert result.passed == 0 and "does not define complete_one" in result.cases[0].message


def test_reference_is_recomputed_on_another_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    from judge import reference

    grade_module = importlib.import_module("judge.grade")
    real = reference.load("req-lengths")
    other = dict(real, fingerprint=dict(real["fingerprint"], device="cuda (a different machine)"))
    monkeypatch.setattr(grade_module, "_recorded", lambda *_args: other)
    result = grade("req-lengths", SOLUTION, seed=3, save=False)
    assert result.ok, str(result)
    assert any("recomputed" in n for n in result.notes)


def test_cell_magic_grades_cell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from IPython.core.interactiveshell import InteractiveShell

    from judge import progress

    monkeypatch.setattr(registry, "STATE_DIR", tmp_path)  # the magic saves the last result

    import judge

    shell = InteractiveShell.instance()
    judge.load_ipython_extension(shell)
    result = shell.run_cell_magic("judge", "req-lengths --seed 4", SOLUTION.read_text())
    assert isinstance(result, GradeResult) and result.ok
    assert result.file == "this cell" and "this cell" in str(result) and "judge-cell" not in str(result)
    assert progress.load()["req-lengths"].latest.passed == result.total


# ---- commands --------------------------------------------------------------------------------
def test_start_never_overwrites(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from judge import cli

    monkeypatch.setattr(registry, "WORK_DIR", tmp_path / "work")
    assert cli.main(["start", "prefill-adder"]) == 0
    target = tmp_path / "work" / "prefill-adder.py"
    assert target.read_text() == (REPO / "exercises" / "prefill-adder" / "starter.py").read_text()
    target.write_text("# my work\n")
    assert cli.main(["start", "prefill-adder"]) == 0
    assert target.read_text() == "# my work\n" and "keeping your work" in capsys.readouterr().out


def test_list_and_hints(capsys) -> None:
    from judge import cli

    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    for ex_id in ("req-lengths", "prefill-adder", "radix-cache", "overlap-loop"):
        assert ex_id in out
    assert cli.main(["hint", "radix-cache", "2"]) == 0
    out = capsys.readouterr().out
    assert "hint 1 of" in out and "hint 2 of" in out and "hint 3 of" not in out
    assert cli.main(["no-such-exercise"]) == 2


# ---- pieces ----------------------------------------------------------------------------------
def test_scan_finds_reference_use() -> None:
    reps = (api.Replace("minisgl.scheduler.prefill", "PrefillAdder.try_admit"), api.Replace("minisgl.models.weight", "_place"))
    source = textwrap.dedent(
        """
        from minisgl.scheduler.prefill import PrefillAdder as Base
        from minisgl.models.weight import _place
        import minisgl.models.weight as w
        class PrefillAdder(Base):
            def try_admit(self, p):
                return Base.try_admit(self, p) or super().try_admit(p) or getattr(Base, "try_admit") or w._place
        """
    )
    lines = sorted({f.line for f in install.scan(source, reps, "x")})
    assert lines == [3, 7]
    clean = "from minisgl.scheduler.prefill import PrefillAdder as Base\nclass PrefillAdder(Base):\n    def try_admit(self, p):\n        return self.continue_chunk(p)\n"
    assert install.scan(clean, reps, "x") == []


def test_compare_tolerances_and_paths() -> None:
    def close(values, dtype):
        return [{"label": "logits", "kind": "close", "dtype": dtype, "shape": [len(values)], "value": values}]

    assert first_difference(close([1.0, 2.0 + 5e-5], "torch.float32"), close([1.0, 2.0], "torch.float32")) is None
    assert first_difference(close([1.0, 2.01], "torch.float32"), close([1.0, 2.0], "torch.float32")) is not None
    assert first_difference(close([1.0, 2.05], "torch.bfloat16"), close([1.0, 2.0], "torch.bfloat16")) is None
    got = [{"label": "step 1: rows", "kind": "eq", "value": [[1, 2], [3, 5]]}]
    exp = [{"label": "step 1: rows", "kind": "eq", "value": [[1, 2], [3, 4]]}]
    diff = first_difference(got, exp)
    assert diff.where == "step 1: rows" and "[1][1]" in diff.detail
    assert first_difference([{"label": "x", "kind": "eq", "value": 1}], [{"label": "x", "kind": "eq", "value": True}]) is not None


def test_one_status_type_decides_verdicts() -> None:
    from judge.grade import decide
    from judge.result import CaseResult, Status

    exp = [{"label": "x", "kind": "eq", "value": 1}]
    assert decide({"completed": True, "obs": exp}, exp)[0] is Status.PASS
    assert decide({"completed": True, "obs": [dict(exp[0], value=2)]}, exp)[0] is Status.FAIL
    assert decide({"completed": False, "status": "timeout", "obs": []}, exp)[0] is Status.TIMEOUT
    assert decide(None, exp)[0] is Status.NOT_RUN
    with pytest.raises(ValueError):
        CaseResult(name="x", kind="unit", status="passed")  # not a verdict


def test_every_exercise_is_complete() -> None:
    stage_1_2 = {"req-lengths", "base-op", "weight-stream", "paged-alloc", "attn-metadata", "batched-sampler", "prefill-adder",
                 "cache-req", "radix-cache", "chunk-size", "overlap-loop"}
    assert stage_1_2 <= set(registry.exercise_ids())
    for ex_id in sorted(stage_1_2):
        ex = registry.load(ex_id)
        kinds = {c.kind for c in ex.cases}
        assert kinds == {api.UNIT, api.E2E}, f"{ex_id}: needs unit and end-to-end cases"
        assert any(c.seeds for c in ex.cases), f"{ex_id}: needs randomised cases"
        assert registry.hints(ex_id), f"{ex_id}: no hints"
        assert (registry.REFERENCE_DIR / f"{ex_id}.json").exists(), f"{ex_id}: no recorded reference"


GOOD = 'chapter = 7\ntitle = "t"\ndifficulty = 2\nreplaces = ["minisgl.scheduler.prefill:PrefillAdder.try_admit"]\n'


@pytest.mark.parametrize("text, says", [
    (GOOD.replace("chapter = 7\n", ""), "missing field(s) 'chapter'"),
    (GOOD.replace("chapter = 7", 'chapter = "seven"'), "field 'chapter' must be a whole number"),
    (GOOD.replace("difficulty = 2", "difficulty = 4"), "difficulty is 1, 2 or 3"),
    (GOOD + "replace = []\n", "unknown field(s) 'replace'"),
    (GOOD.replace(":PrefillAdder", ".PrefillAdder"), "field 'replaces': 'minisgl.scheduler.prefill.PrefillAdder.try_admit' is not \"module:qualname\""),
    (GOOD + 'timed = ["PrefillAdder.admit"]\n', "timed symbol 'PrefillAdder.admit' is not one of the required"),
    (GOOD + 'optional = ["minisgl.scheduler.prefill:PrefillAdder.try_admit"]\n', "name PrefillAdder.try_admit more than once"),
    (GOOD.replace('replaces = ["', 'replaces = [1, "'), "field 'replaces' lists strings, got 1"),
    (GOOD, None),  # the well-formed one loads, its id from the folder
    ("chapter = 7\ntitle = ", "exercise.toml: "),  # not TOML
])
def test_declaration_errors_name_file_and_field(tmp_path: Path, text: str, says) -> None:
    from judge import declaration

    folder = tmp_path / "my-exercise"
    folder.mkdir()
    (folder / "exercise.toml").write_text(text)
    if says is None:
        ex = declaration.load(folder)
        assert (ex.id, ex.chapter, [r.qualname for r in ex.replaces]) == ("my-exercise", 7, ["PrefillAdder.try_admit"])
        return
    with pytest.raises(declaration.DeclarationError) as err:
        declaration.load(folder)
    assert str(folder / "exercise.toml") in str(err.value) and says in str(err.value)


def test_missing_declaration_and_a_second_one_in_cases_are_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from judge import cli, declaration

    with pytest.raises(declaration.DeclarationError, match="exercise.toml is missing"):
        declaration.load(tmp_path)
    root = tmp_path / "exercises" / "x-ex"
    root.mkdir(parents=True)
    (root / "exercise.toml").write_text(GOOD)
    (root / "cases.py").write_text("from judge.api import case\nEXERCISE = None\n\n@case('c')\ndef c(obs):\n    pass\n")
    monkeypatch.setattr(registry, "EXERCISES_DIR", tmp_path / "exercises")
    monkeypatch.setattr(registry, "REPO_ROOT", tmp_path)
    with pytest.raises(declaration.DeclarationError, match="cases.py defines EXERCISE: an exercise is declared once, in exercise.toml"):
        registry.load("x-ex")
    (root / "exercise.toml").write_text(GOOD.replace("difficulty = 2", "difficulty = \"hard\""))
    assert cli.main(["list"]) == 2  # the command says what is wrong, without a traceback
    assert "exercises/x-ex/exercise.toml: field 'difficulty' must be a whole number, got 'hard'" in capsys.readouterr().err


# ---- the learner's class is installed whole, and super() works as in a subclass -------------------
PREFILL = variants.solution_file("prefill-adder")
OVERLAP = variants.solution_file("overlap-loop")


def test_helper_methods_are_installed_with_the_piece(tmp_path: Path) -> None:
    old = "        if self.cache.available_pages < self.reserved_pages + need:\n"
    method = registry.declared("prefill-adder").replaces[0].attr  # the piece the learner writes
    helper = (
        "    @staticmethod\n    def _limit() -> int:\n        return 0\n\n"
        "    def _fits(self, need: int) -> bool:\n        return self.cache.available_pages >= self.reserved_pages + need + self._limit()\n\n"
        f"    def {method}("
    )
    path = _variant(tmp_path, "helpers", old, "        if not self._fits(need):\n", PREFILL)
    assert f"    def {method}(" in path.read_text()
    path.write_text(path.read_text().replace(f"    def {method}(", helper, 1))
    result = grade("prefill-adder", path, seed=1, save=False)
    assert result.ok, str(result)


def test_module_level_helpers_go_with_the_function(tmp_path: Path) -> None:
    moe = variants.solution_file("moe-align")
    path = _variant(tmp_path, "module_helper", "    padded = (counts + block_size - 1) // block_size * block_size\n",
                    "    padded = _round_up(counts, block_size)\n", moe)
    path.write_text(path.read_text() + "\n\ndef _round_up(x, m):\n    return (x + m - 1) // m * m\n")
    result = grade("moe-align", path, seed=1, save=False)
    assert result.ok, str(result)


def test_super_calls_resolve_as_in_a_subclass(tmp_path: Path) -> None:
    # super() reaches the engine's schedule_next_batch (not a replaced symbol), and a helper of ours
    path = _variant(tmp_path, "supers", "        batch = self.schedule_next_batch()\n",
                    "        batch = super().schedule_next_batch()\n        assert self._mine() == 7 and super().is_idle in (True, False)\n", OVERLAP)
    path.write_text(path.read_text().replace("    def process_results(", "    def _mine(self) -> int:\n        return 7\n\n    def process_results(", 1))
    result = grade("overlap-loop", path, seed=1, save=False)
    assert result.ok, str(result)


# ---- whatever the learner's code does to processes, grading ends and nothing is left behind -----
def _judge_processes() -> set:
    from judge import procs

    return {p for p in procs.table() if procs.marked(p)}  # started by this judge process


def _left_behind(before: set) -> set:
    """Processes the grading started that are still alive, beyond the fork servers."""
    import time

    from judge import procs, runner

    servers = {p.pid for p in runner.Zygote._procs.values()}
    time.sleep(0.3)
    return {p for p in _judge_processes() - before - servers if procs.alive(p)}


_BODY = "        return self.device_len - self.cached_len"


@pytest.mark.parametrize("name, code, expected", [
    # kills the keeper that started it: the case still ends, with the rest graded
    # (where Landlock scopes signals the kill is refused: the file goes on, and the grading ends as well)
    ("kills_parent", "import os, signal\ntry:\n    os.kill(os.getppid(), signal.SIGKILL)\nexcept PermissionError:\n    pass\n", None),
    # kills the fork server too (its grandparent; in a pid namespace of its own, its parent is the
    # namespace's first process, whose parent it cannot see: 0, which kill() takes for its own group)
    ("kills_server", "import os, signal\n_stat = open(f'/proc/{os.getppid()}/stat').read()\n"
                     "_server = int(_stat[_stat.rindex(')') + 2:].split()[1])\ntry:\n"
                     "    if _server > 0:\n        os.kill(_server, signal.SIGKILL)\n    os.kill(os.getppid(), signal.SIGKILL)\n"
                     "except PermissionError:\n    pass\n", None),
    # kills every process this judge started but itself: fork server, keepers, the reference's worker
    ("kills_helpers", "import os, signal\n_tag = ('MINISGL_JUDGE_PROCESS=' + os.environ['MINISGL_JUDGE_PROCESS']).encode()\n"
                      "for _p in os.listdir('/proc'):\n    try:\n"
                      "        if _p.isdigit() and int(_p) != os.getpid() and _tag in open(f'/proc/{_p}/environ', 'rb').read().split(b'\\0'):\n"
                      "            os.kill(int(_p), signal.SIGKILL)\n    except OSError:\n        pass\n", None),
    # fifty children, each in its own session, ignoring SIGTERM, then a crash at import
    ("forks_then_raises", "import os, signal, time\nfor _ in range(50):\n    if os.fork() == 0:\n        os.setsid()\n"
                          "        signal.signal(signal.SIGTERM, signal.SIG_IGN)\n        time.sleep(600)\n        os._exit(0)\n"
                          "raise RuntimeError('boom')\n", "error"),
    # a double fork: the grandchild is orphaned at once, then the worker exits
    ("orphans", "import os, time\nif os.fork() == 0:\n    if os.fork() == 0:\n        os.setsid()\n        time.sleep(600)\n"
                "    os._exit(0)\n", None),
])
def test_processes_do_not_escape_at_import(tmp_path: Path, name: str, code: str, expected) -> None:
    import time

    before = _judge_processes()
    path = tmp_path / f"{name}.py"
    path.write_text(code + SOLUTION.read_text())
    t0 = time.monotonic()
    result = grade("req-lengths", path, seed=1, save=False, timeout_scale=0.5)
    assert time.monotonic() - t0 < 120, str(result)
    if expected is None:
        assert result.ok, str(result)
    else:
        assert result.cases[0].status == expected and result.passed == 0, str(result)
    assert _left_behind(before) == set()


def test_processes_started_in_cases_do_not_outlive_the_verdict(tmp_path: Path) -> None:
    # three children per call, in new sessions, then the worker exits without a word (os._exit)
    forks = ("        import os, time\n        for _ in range(3):\n            if os.fork() == 0:\n                os.setsid()\n"
             "                time.sleep(600)\n                os._exit(0)\n        if self.prompt_len == 10:\n            os._exit(0)\n")
    before = _judge_processes()
    path = _variant(tmp_path, "case_forks", _BODY, forks + _BODY)
    result = grade("req-lengths", path, seed=1, save=False)
    assert _statuses(result)["a 10-token prompt prefilled in chunks of 4"] == "error", str(result)
    assert _left_behind(before) == set()
    # a passing grading whose code leaves a session leader and a thread running
    # (once per worker: a child per call would pass the judge's cap on a worker's processes)
    daemon = ("        import builtins, os, threading, time\n        if not getattr(builtins, '_left_running', False):\n"
              "            builtins._left_running = True\n"
              "            threading.Thread(target=time.sleep, args=(600,), daemon=False).start()\n"
              "            if os.fork() == 0:\n                os.setsid()\n                time.sleep(600)\n                os._exit(0)\n")
    path = _variant(tmp_path, "daemon", _BODY, daemon + _BODY)
    assert grade("req-lengths", path, seed=1, save=False).ok
    assert _left_behind(before) == set()


# ---- the graded code cannot change what grades it ------------------------------------------------
TAMPERED = "base-op"  # an exercise whose files this test rewrites (and puts back) while it runs


def test_rewriting_the_reference_changes_no_verdict(tmp_path: Path) -> None:
    # the solution, plus code that empties the recorded reference and appends to the cases: were
    # either trusted, the solution would fail (it records observations the blanked reference lacks)
    ref = REPO / "judge" / "reference" / f"{TAMPERED}.json"
    cases = REPO / "exercises" / TAMPERED / "cases.py"
    original_ref, original_cases = ref.read_bytes(), cases.read_bytes()
    answer = variants.solution_file(TAMPERED)
    tamper = tmp_path / "tamper.py"
    # where the worker is confined (Landlock) the reads and writes fail; elsewhere they succeed
    tamper.write_text(
        "import json, pathlib\n"
        f"_root = pathlib.Path({str(REPO)!r})\n"
        f"_ref = _root / 'judge' / 'reference' / '{TAMPERED}.json'\n"
        "try:\n"
        "    _data = json.loads(_ref.read_text())\n"
        "    _ref.write_text(json.dumps(dict(_data, cases={k: [] for k in _data['cases']})))\n"
        "except OSError:\n    pass\n"
        "try:\n"
        f"    with open(_root / ('exer' + 'cises') / '{TAMPERED}' / 'cases.py', 'a') as f:\n        f.write('\\nraise SystemExit\\n')\n"
        "except OSError:\n    pass\n"
        + answer.read_text()
    )
    from judge import sandbox

    try:
        result = grade(TAMPERED, tamper, seed=1, save=False)
        assert result.ok, str(result)
        changed = any(f"{TAMPERED}.json (changed)" in w and "cases.py (changed)" in w for w in result.warnings)
        assert changed != sandbox.available(), str(result)  # confined: nothing changed; else changed and put back
        assert ref.read_bytes() == original_ref and cases.read_bytes() == original_cases
        again = grade(TAMPERED, answer, seed=1, save=False)
        assert again.ok and not any("graded code changed" in w for w in again.warnings), str(again)
        # changed while no grading ran (say, by a grading the judge could not finish): found by the
        # hash git keeps of the committed version, which is used instead
        data = json.loads(original_ref)
        ref.write_text(json.dumps(dict(data, cases={k: [] for k in data["cases"]})))
        later = grade(TAMPERED, answer, seed=1, save=False)
        assert later.ok and any(f"{TAMPERED}.json differs from its committed version" in w for w in later.warnings), str(later)
    finally:
        ref.write_bytes(original_ref)
        cases.write_bytes(original_cases)


# ---- verdicts name the field; hot-path pieces are timed --------------------------------------------
def test_failure_names_the_field(tmp_path: Path) -> None:
    path = _variant(tmp_path, "remain", "        return self.max_device_len - self.device_len", "        return self.max_device_len - self.device_len - 1")
    bad = grade("req-lengths", path, seed=1, save=False).first_failure()
    assert bad is not None and bad.status == "fail"
    assert bad.message.startswith("remain_len: got "), bad.message


def test_a_passing_hot_path_piece_reports_its_speed() -> None:
    result = grade("prefill-adder", PREFILL, seed=1, save=False)
    assert result.ok and result.speed, str(result)
    timed = registry.declared("prefill-adder").timed[0].split(".")[-1]
    assert result.speed[0].startswith(f"your {timed}: ") and "x the reference's time" in result.speed[0]
    assert f"speed: your {timed}" in str(result)


def test_fresh_interpreter_workers_contain_processes_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the GPU path: each worker is a new interpreter; its keeper kill and orphans are handled alike
    from judge import runner

    monkeypatch.setattr(runner, "USE_ZYGOTE", False)
    before = _judge_processes()
    path = tmp_path / "fresh_orphans.py"
    path.write_text("import os, signal, time\nif os.fork() == 0:\n    if os.fork() == 0:\n        os.setsid()\n        time.sleep(600)\n"
                    "    os._exit(0)\ntry:\n    os.kill(os.getppid(), signal.SIGKILL)\nexcept PermissionError:\n    pass\n" + SOLUTION.read_text())
    result = grade("req-lengths", path, seed=1, save=False)
    assert result.ok, str(result)
    assert _left_behind(before) == set()


def test_memory_of_forked_children_counts(tmp_path: Path) -> None:
    # four children that each fill 300 MiB: the worker itself stays small, together they pass 1 GiB
    hog = ("        if self.prompt_len == 10:\n            import os, time, torch\n            for _ in range(4):\n"
           "                if os.fork() == 0:\n                    x = torch.ones(300 * 2**20, dtype=torch.uint8)\n"
           "                    time.sleep(600)\n                    os._exit(0)\n            time.sleep(30)\n")
    before = _judge_processes()
    path = _variant(tmp_path, "fork_hogs", _BODY, hog + _BODY)
    result = grade("req-lengths", path, seed=1, save=False, memory_limit_gb=1.0)
    assert _statuses(result)["a 10-token prompt prefilled in chunks of 4"] == "oom", str(result)
    assert _left_behind(before) == set()


def test_a_stopped_fork_server_is_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the graded code stops (SIGSTOP) the fork server; the next grading gets a new one
    from judge import runner

    monkeypatch.setattr(runner, "SPAWN_S", 5.0)
    path = tmp_path / "stops_server.py"
    path.write_text("import os, signal\n_stat = open(f'/proc/{os.getppid()}/stat').read()\n"
                    "_server = int(_stat[_stat.rindex(')') + 2:].split()[1])\ntry:\n"
                    "    if _server > 0:  # 0: outside its pid namespace, unseen (kill() would take 0 for its own group)\n"
                    "        os.kill(_server, signal.SIGSTOP)\nexcept PermissionError:\n    pass\n"
                    + SOLUTION.read_text())
    assert grade("req-lengths", path, seed=1, save=False).ok
    assert grade("req-lengths", SOLUTION, seed=1, save=False).ok
