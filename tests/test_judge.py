"""The judge: its own check over every exercise, and its verdicts on learner code that crashes,
loops, runs out of memory, mutates its inputs or reaches for the reference."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from judge import api, grade, install, registry
from judge.compare import first_difference
from judge.result import GradeResult

REPO = Path(__file__).resolve().parent.parent
SOLUTION = REPO / "exercises" / "req-lengths" / "solution.py"


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
    sampler = REPO / "exercises" / "batched-sampler" / "solution.py"
    path = _variant(tmp_path, "in_place", "        greedy = logits.argmax(dim=-1)\n", "        logits.mul_(1.0000001)\n        greedy = logits.argmax(dim=-1)\n", sampler)
    result = grade("batched-sampler", path, seed=2, save=False)
    bad = result.first_failure()
    assert bad is not None and bad.status == "fail" and "left unchanged" in bad.where and bad.got.startswith("changed")


def test_reaching_for_the_reference_is_rejected(tmp_path: Path) -> None:
    static = _variant(tmp_path, "static", "        return self.device_len - self.cached_len", "        return super().extend_len")
    result = grade("req-lengths", static, seed=1, save=False)
    assert {c.status for c in result.cases} == {"rejected"} and "super().extend_len" in result.cases[0].message
    sneaky = _variant(tmp_path, "sneaky", "class Req(EngineReq):", "_REF = getattr(EngineReq, 'complete' + '_one')\n\n\nclass Req(EngineReq):")
    sneaky.write_text(sneaky.read_text().replace("        if self.is_chunk:\n", "        if self.is_chunk:\n            return _REF(self)\n"))
    result = grade("req-lengths", sneaky, seed=1, save=False)
    assert "rejected" in {c.status for c in result.cases}, str(result)
    assert any("engine's own Req.complete_one" in c.message for c in result.cases)
    borrowed = tmp_path / "borrowed.py"  # the reference solution, loaded under another name
    borrowed.write_text(
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('ref_copy', '/'.join([{str(REPO)!r}, 'exer' + 'cises', 'req-lengths', 'solu' + 'tion.py']))\n"
        "mod = importlib.util.module_from_spec(spec)\nsys.modules['ref_copy'] = mod\nspec.loader.exec_module(mod)\nReq = mod.Req\n"
    )
    result = grade("req-lengths", borrowed, seed=1, save=False)
    assert result.cases[0].status == "rejected" and "exercises/req-lengths/solution.py" in result.cases[0].message


def test_load_errors_are_reported(tmp_path: Path) -> None:
    broken = _variant(tmp_path, "broken", "    def complete_one(self) -> None:", "    def complete_one(self) -> None")
    result = grade("req-lengths", broken, seed=1, save=False)
    assert result.passed == 0 and "SyntaxError" in result.cases[0].message and "line" in result.cases[0].message
    missing = _variant(tmp_path, "missing", "    def complete_one(self) -> None:", "    def complete_two(self) -> None:")
    result = grade("req-lengths", missing, seed=1, save=False)
    assert result.passed == 0 and "does not define complete_one" in result.cases[0].message


def test_reference_is_recomputed_on_another_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    from judge import reference

    real = reference.load("req-lengths")
    other = dict(real, fingerprint=dict(real["fingerprint"], device="cuda (a different machine)"))
    monkeypatch.setattr(reference, "load", lambda _id: other)
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
