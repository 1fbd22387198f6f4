"""No saved notebook output is stale: `tools/stale_outputs.py` compares a cell's saved outputs with a
fresh run's, and `chapters/conftest.py` runs that comparison inside the suite's nbval run.

Claims: timings, rates, addresses and paths do not count (chapters/nbval_sanitize.cfg), nor images,
nor cells tagged nbval-skip or nbval-ignore-output; a changed number or line does, and is named;
under nbval a stale cell fails its test, and in a notebook not yet refreshed it warns instead.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook, new_output

from file_module import load_file

REPO = Path(__file__).resolve().parents[1]
so = load_file(REPO / "tools" / "stale_outputs.py", "_stale_outputs_under_test")
PATTERNS = so.load_patterns()


def _cell(source, *outputs, tags=()):
    cell = new_code_cell(source, execution_count=1, outputs=list(outputs))
    if tags:
        cell.metadata["tags"] = list(tags)
    return cell


def _stdout(text):
    return new_output("stream", name="stdout", text=text)


def _result(plain, **more):
    return new_output("execute_result", data={"text/plain": plain, **more}, execution_count=1)


def test_the_sanitize_file_hides_timings_rates_and_addresses():
    assert [p for p in PATTERNS if "ms" in p[0]], "the timings pattern is read"
    saved = so.comparable([_stdout("took 956.1 ms, 195 tok/s at 0x7f00deadbeef\n")], PATTERNS)
    fresh = so.comparable([_stdout("took 44 ms, "), _stdout("3000 tok/s at 0x7f11cafe0000\n")], PATTERNS)
    assert so.first_difference(saved, fresh) is None


def test_a_changed_number_is_named_with_its_line():
    saved = so.comparable([_stdout("minisgl: 106 Python files\n")], PATTERNS)
    fresh = so.comparable([_stdout("minisgl: 107 Python files\n")], PATTERNS)
    diff = so.first_difference(saved, fresh)
    assert "106" in diff and "107" in diff and diff.startswith("line 1")


def test_images_and_ignored_cells_are_not_compared():
    stored = new_notebook(cells=[
        _cell("plot()", _result("<Figure size 10x10>", **{"image/png": "AAAA"})),
        _cell("timing()", _stdout("1.5 GB/s\n"), tags=["nbval-ignore-output"]),
        _cell("%%judge x", _stdout("old\n"), tags=["nbval-skip"]),
        _cell("print(n)", _stdout("3\n")),
    ])
    fresh = new_notebook(cells=[
        _cell("plot()", _result("<Figure size 10x10>", **{"image/png": "BBBB"})),
        _cell("timing()", _stdout("9.9 GB/s\n"), tags=["nbval-ignore-output"]),
        _cell("%%judge x", _stdout("new\n"), tags=["nbval-skip"]),
        _cell("print(n)", _stdout("4\n")),
    ])
    found = so.stale_cells(stored, fresh, PATTERNS)
    assert [s.cell for s in found] == [3]
    with pytest.raises(ValueError, match="same cells"):
        so.stale_cells(stored, new_notebook(cells=[_cell("other")]), PATTERNS)


def test_a_figure_sent_once_or_twice_is_the_same_output():
    picture = new_output("display_data", data={"text/plain": "<Figure size 1100x560 with 1 Axes>", "image/png": "AAAA"})
    bare = new_output("display_data", data={"text/plain": "<Figure size 1100x560 with 1 Axes>"})
    assert so.first_difference(so.comparable([picture], PATTERNS), so.comparable([picture, bare], PATTERNS)) is None


def test_a_markdown_output_is_compared_by_its_markdown():
    table = _result("<IPython.core.display.Markdown object>", **{"text/markdown": "| 21 | - |"})
    grown = _result("<IPython.core.display.Markdown object>", **{"text/markdown": "| 21 | decode-floor |"})
    assert so.first_difference(so.comparable([table], PATTERNS), so.comparable([grown], PATTERNS))


def test_html_counts_only_where_there_is_no_plain_text():
    shown = _result("def f(): ...", **{"text/html": "<div>old colours</div>"})
    again = _result("def f(): ...", **{"text/html": "<div>new colours</div>"})
    assert so.first_difference(so.comparable([shown], PATTERNS), so.comparable([again], PATTERNS)) is None
    table = new_output("display_data", data={"text/html": "<td>1</td>"})
    other = new_output("display_data", data={"text/html": "<td>2</td>"})
    assert so.first_difference(so.comparable([table], PATTERNS), so.comparable([other], PATTERNS))


def test_under_nbval_a_stale_cell_fails_and_in_a_notebook_not_yet_refreshed_warns(tmp_path: Path):
    """The plugin itself, in a copy of the layout: two notebooks whose second cell saved '3' but
    prints 4, one of them added to the plugin's list of notebooks not yet refreshed."""
    (tmp_path / "tools").mkdir()
    shutil.copy(REPO / "tools" / "stale_outputs.py", tmp_path / "tools")
    chapters = tmp_path / "chapters"
    chapters.mkdir()
    shutil.copy(REPO / "chapters" / "nbval_sanitize.cfg", chapters)
    plugin = (REPO / "chapters" / "conftest.py").read_text()
    marker = "NOT_YET_REFRESHED = frozenset({"
    assert marker in plugin
    (chapters / "conftest.py").write_text(plugin.replace(marker, marker + '"99_not_refreshed.ipynb", '))
    for name in ("21_stale.ipynb", "99_not_refreshed.ipynb"):
        nb = new_notebook(cells=[_cell("import time; print(f'{time.time() % 1:.3f} s')", _stdout("0.123 s\n")),
                                 _cell("print(2 + 2)", _stdout("3\n"))])
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nbformat.write(nb, chapters / name)
    args = ["--nbval-lax", "--nbval-current-env", "--nbval-sanitize-with", str(chapters / "nbval_sanitize.cfg"),
            "-W", "default"]
    notebooks = [str(chapters / "21_stale.ipynb"), str(chapters / "99_not_refreshed.ipynb")]
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args, *notebooks],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    out = run.stdout + run.stderr
    assert run.returncode != 0 and "1 failed, 3 passed" in out, out
    assert "FAILED chapters/21_stale.ipynb::Cell 1" in out, out
    warned = "StaleOutputWarning: 99_not_refreshed.ipynb, Cell 1: the saved output is stale"
    assert f"{warned} (line 1: saved 'stdout: 3' / fresh 'stdout: 4')" in out, out
