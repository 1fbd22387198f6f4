"""The learner's path in a notebook: a chapter's set-up registers `%%judge`, grading a cell says
"this cell", and the judge's record keeps the best result beside the latest."""

from __future__ import annotations

import json
import re
import multiprocessing
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from judge import progress, registry, variants
from judge.result import CaseResult, GradeResult

REPO = Path(__file__).resolve().parents[1]


def _result(passed: int, total: int = 4, file: str = "work/req-lengths.py") -> GradeResult:
    cases = [CaseResult(f"case {i}", "unit", "pass" if i < passed else "fail") for i in range(total)]
    return GradeResult("req-lengths", file, "cpu", cases)


def test_record_keeps_best_beside_latest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "STATE_DIR", tmp_path)
    assert progress.load() == {}
    progress.record(_result(2), when="d1")
    progress.record(_result(4), when="d2")
    p = progress.record(_result(1, file="this cell"), when="d3")
    assert p.best == progress.Attempt(4, 4, "work/req-lengths.py", "d2") and p.best.ok
    assert p.latest == progress.Attempt(1, 4, "this cell", "d3") and not p.latest.ok
    assert progress.load()["req-lengths"] == p  # what the index and `judge.py list` read back
    assert str(p) == "best 4/4 (d2), latest 1/4 (d3)"
    progress.record(_result(4), when="d4")  # an equal score is the newer best
    assert progress.load()["req-lengths"].best.when == "d4"


def _record_many(state_dir: str, exercise: str) -> None:
    registry.STATE_DIR = Path(state_dir)
    for n in range(12):
        progress.record(GradeResult(exercise, "work.py", "cpu", [CaseResult("c", "unit", "pass")] * (n + 1)), when=f"{n}")


def test_gradings_recorded_at_once_from_several_kernels_are_all_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two notebooks (or a notebook and `judge.py`) grading at the same moment: each one's record survives."""
    exercises = registry.exercise_ids()[:4]
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_record_many, args=(str(tmp_path), ex)) for ex in exercises]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * len(procs)
    monkeypatch.setattr(registry, "STATE_DIR", tmp_path)
    record = progress.load()
    assert {ex: (record[ex].latest.when, record[ex].best.passed) for ex in exercises} == {ex: ("11", 12) for ex in exercises}


def test_record_reads_the_first_layout_and_survives_garbage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "STATE_DIR", tmp_path)
    (tmp_path / "results.json").write_text(json.dumps({
        "req-lengths": {"passed": 3, "total": 4, "file": "work/req-lengths.py", "when": "old"},
        "paged-alloc": {"passed": "many"},
    }))
    state = progress.load()
    assert set(state) == {"req-lengths"} and state["req-lengths"].best == state["req-lengths"].latest
    (tmp_path / "results.json").write_text("{not json")
    assert progress.load() == {}


def test_list_shows_best_and_latest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from judge import cli

    monkeypatch.setattr(registry, "STATE_DIR", tmp_path)
    monkeypatch.setattr(registry, "WORK_DIR", tmp_path / "work")
    progress.record(_result(4), when="2026-01-02 10:00")
    progress.record(_result(1), when="2026-01-02 10:05")
    assert cli.main(["list"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("req-lengths "))
    assert "4/4 (2026-01-02 10:00)" in row and "1/4 (2026-01-02 10:05)" in row
    assert row.index("4/4") < row.index("1/4")  # best first, latest beside it


def test_chapter_setup_registers_judge_and_names_the_cell(tmp_path: Path) -> None:
    """In a fresh IPython: no `import judge`, only the chapter's set-up, then a `%%judge` cell."""
    wrong = variants.variant_file("req-lengths", "chunk_off_by_one").read_text()
    script = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path
        from IPython.core.interactiveshell import InteractiveShell
        shell = InteractiveShell.instance()
        assert "judge" not in shell.magics_manager.magics["cell"]
        shell.run_cell("import book\\nbook.setup_chapter(1, quiet=True)").raise_error()
        print("registered:", "judge" in shell.magics_manager.magics["cell"])
        import judge.registry as registry
        registry.STATE_DIR = Path({str(tmp_path)!r})
        body = {wrong!r}
        shell.run_cell("%%judge req-lengths --seed 5\\n" + body).raise_error()
        result = shell.user_ns["_"]
        print("RESULT", result.passed, result.total)
        print(str(result))
        bad = shell.run_cell("%%judge no-such-exercise\\npass\\n")
        print("unknown id raises", type(bad.error_in_exec).__name__)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO / "chapters", capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout
    assert "registered: True" in text
    assert "req-lengths: grading this cell" in text
    passed, total = map(int, text.split("RESULT ")[1].split()[:2])
    assert 0 < total and passed < total  # the wrong variant fails some case
    # no temporary file name (the checkout itself may live under the temporary folder, as in CI)
    assert "judge-cell" not in text and tempfile.gettempdir() not in text.replace(str(REPO), "<repo>")
    assert "unknown id raises UsageError" in text and "known exercises" in out.stdout + out.stderr
    record = json.loads((tmp_path / "results.json").read_text())["req-lengths"]
    assert record["latest"]["file"] == "this cell" and record["latest"]["passed"] == passed


WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def _widget_cells(nb):
    return [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and any(WIDGET_VIEW in o.get("data", {}) for o in c.get("outputs", []))]


def test_saved_widget_views_have_their_state_and_say_when_they_come_alive() -> None:
    """A saved view renders only if the notebook stores its widgets' state; the text before it
    tells the reader the controls work once the cells have run."""
    import nbformat

    seen = 0
    for path in sorted((REPO / "chapters").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        cells = _widget_cells(nb)
        if not cells:
            continue
        state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
        for i in cells:
            seen += 1
            for out in nb.cells[i].outputs:
                view = out.get("data", {}).get(WIDGET_VIEW)
                if view:
                    assert view["model_id"] in state, f"{path.name} cell {i}: its widget state was not saved"
            before = next(c.source for c in reversed(nb.cells[:i]) if c.cell_type == "markdown")
            assert "come alive when" in before, f"{path.name} cell {i}: say that the controls come alive when the cells run"
    assert seen >= 3  # chapters 1, 4 and 9 have one each


def test_index_tables_read_the_judges_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO / "chapters"))
    import contents

    monkeypatch.setattr(registry, "STATE_DIR", tmp_path / "state")
    monkeypatch.setattr(registry, "WORK_DIR", tmp_path / "work")
    ids = registry.exercise_ids()
    table = contents.chapter_table().data
    for ex_id in ids:  # every exercise sits in its chapter's row, linked to its statement
        ex = registry.load(ex_id)
        row = next(line for line in table.splitlines() if line.startswith(f"| {ex.chapter} |"))
        assert f"[{ex_id}](../exercises/{ex_id}/README.md)" in row
    assert "No exercise graded yet" in contents.progress().data

    progress.record(_result(4), when="2026-01-02 10:00")
    progress.record(_result(1, file="this cell"), when="2026-01-02 10:05")
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "req-lengths.py").write_text("# mine\n")
    text = contents.progress().data
    assert f"**1 of {len(ids)} exercises pass**" in text
    row = next(line for line in text.splitlines() if "[req-lengths]" in line)
    assert "✓" in row and "4/4 (2026-01-02 10:00)" in row and "1/4 (2026-01-02 10:05)" in row
    assert "[work/req-lengths.py](../work/req-lengths.py)" in row
    other = next(line for line in text.splitlines() if "[base-op]" in line)
    assert "✓" not in other and "python judge.py start base-op" in other


def test_readme_chapter_table_lists_every_chapter_with_its_exercises() -> None:
    import re

    text = (REPO / "README.md").read_text()
    section = text.split("\n## Chapters\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        m = re.match(r"\| (\d+) \| \[[^]]+\]\(chapters/([^)]+)\) \| (.*) \|$", line)
        if m:
            rows[int(m.group(1))] = (m.group(2), re.findall(r"\(exercises/([^/]+)/README\.md\)", m.group(3)))
    notebooks = {int(p.name[:2]): p.name for p in (REPO / "chapters").glob("[0-9][0-9]_*.ipynb")}
    assert {n: name for n, (name, _) in rows.items()} == notebooks, "README's chapter table and chapters/ differ"
    by_chapter: dict = {}
    for ex_id in registry.exercise_ids():
        by_chapter.setdefault(registry.load(ex_id).chapter, []).append(ex_id)
    for n, (_, ids) in rows.items():
        assert sorted(ids) == sorted(by_chapter.get(n, [])), f"README: chapter {n}'s exercises"
    for ex_id in registry.exercise_ids():
        assert (REPO / "exercises" / ex_id / "README.md").is_file()


def test_the_terminal_treats_an_untouched_starter_as_the_cell_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """README step 3 on a starter: "not started", nothing graded, the learner's latest result kept."""
    from judge import cli
    from judge.magic import judge_cell

    monkeypatch.setattr(registry, "STATE_DIR", tmp_path / "state")
    monkeypatch.setattr(registry, "WORK_DIR", tmp_path / "work")
    progress.record(_result(4, file="this cell"), when="d1")
    assert cli.main(["start", "req-lengths"]) == 0
    capsys.readouterr()
    assert cli.main(["req-lengths"]) == 1
    said = capsys.readouterr().out
    assert said.startswith("req-lengths: not started.") and "work/req-lengths.py still holds the starter" in said
    assert "your progress is unchanged" in said and "score" not in said
    starter = registry.learner_path("req-lengths").read_text()
    assert "your progress is unchanged" in str(judge_cell("req-lengths", starter))  # the cell says the same
    assert progress.load()["req-lengths"].latest == progress.Attempt(4, 4, "this cell", "d1")


def test_a_grading_explains_points_and_links_the_hints() -> None:
    cases = [CaseResult("a", "unit", "pass", weight=0.5), CaseResult("b", "unit", "fail", weight=0.5, hint=2),
             CaseResult("c", "unit", "pass")]
    result = GradeResult("req-lengths", "this cell", "cpu", cases)
    text, page = str(result), result._repr_html_()
    assert "score: 2/3 cases pass (not yet)" in text and "points: 1.5/2 (what a course grades" in text
    assert "2/3 cases pass</span>, 1.5/2 points" in page and "what a course grades" in page  # the cell shows points too
    assert "<code>python judge.py hint req-lengths 2</code>" in page and "`" not in page  # no literal backticks
    link = re.search(r"<a href='([^']+)'>exercises/req-lengths/hints.md</a>", page)
    assert link and (Path.cwd() / link.group(1)).resolve() == REPO / "exercises" / "req-lengths" / "hints.md"


def test_listings_take_the_themes_colours_and_their_caption_sits_below(monkeypatch: pytest.MonkeyPatch) -> None:
    """A dark theme must not get light-theme colours (dark blue and grey on black): the listing's
    colours are JupyterLab's CSS variables, each with a fallback for other viewers."""
    monkeypatch.syspath_prepend(str(REPO / "chapters"))
    import book

    page = book.source("minisgl.core:Req.complete_one", 1)._repr_mimebundle_()[0]["text/html"]
    colours = re.findall(r"color: ?([^;\"]+)", page)
    assert colours and all(c.startswith("var(--jp-") for c in colours), colours  # nothing fixed to one theme
    assert "var(--jp-mirror-editor-keyword-color,#" in page and "margin-top:-" not in page
