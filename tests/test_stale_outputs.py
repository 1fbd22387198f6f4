"""No saved notebook output is stale: `tools/stale_outputs.py` compares a cell's saved outputs with a
fresh run's, and `chapters/conftest.py` runs that comparison inside the suite's nbval run.

Claims: timings, rates, addresses and paths do not count (chapters/nbval_sanitize.cfg), nor images,
nor cells tagged nbval-skip or nbval-ignore-output; a changed number or line does, and is named;
under nbval a stale cell fails its test, and in a notebook not yet refreshed it warns instead.
A cell tagged `gpu` (saved from a GPU run) is run but not compared where there is no GPU, and a
refresh there (`--write`) keeps its saved GPU output.
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


def _layout(root: Path, not_refreshed: str = "") -> Path:
    """A copy of the repository's layout for the plugin and the tools; returns its chapters folder."""
    (root / "tools").mkdir()
    for tool in ("stale_outputs.py", "run_notebooks.py", "gpu_outputs.py"):
        shutil.copy(REPO / "tools" / tool, root / "tools")
    chapters = root / "chapters"
    chapters.mkdir()
    shutil.copy(REPO / "chapters" / "nbval_sanitize.cfg", chapters)
    plugin = (REPO / "chapters" / "conftest.py").read_text()
    marker = "NOT_YET_REFRESHED = frozenset({"
    assert marker in plugin
    (chapters / "conftest.py").write_text(plugin.replace(marker, marker + not_refreshed))
    return chapters


def _write(nb, path: Path) -> None:
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


def _nbval(root: Path, *notebooks: Path) -> str:
    """pytest with nbval over `notebooks` as the suite runs it; its output, which must end in a failure."""
    chapters = root / "chapters"
    args = ["--nbval-lax", "--nbval-current-env", "--nbval-sanitize-with", str(chapters / "nbval_sanitize.cfg"),
            "-W", "default"]
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args, *map(str, notebooks)],
                         cwd=root, capture_output=True, text=True, timeout=300)
    out = run.stdout + run.stderr
    assert run.returncode != 0, out
    return out


def test_under_nbval_a_stale_cell_fails_and_in_a_notebook_not_yet_refreshed_warns(tmp_path: Path):
    """The plugin itself, in a copy of the layout: two notebooks whose second cell saved '3' but
    prints 4, one of them added to the plugin's list of notebooks not yet refreshed."""
    chapters = _layout(tmp_path, '"99_not_refreshed.ipynb", ')
    for name in ("21_stale.ipynb", "99_not_refreshed.ipynb"):
        _write(new_notebook(cells=[_cell("import time; print(f'{time.time() % 1:.3f} s')", _stdout("0.123 s\n")),
                                   _cell("print(2 + 2)", _stdout("3\n"))]), chapters / name)
    out = _nbval(tmp_path, chapters / "21_stale.ipynb", chapters / "99_not_refreshed.ipynb")
    assert "1 failed, 3 passed" in out, out
    assert "FAILED chapters/21_stale.ipynb::Cell 1" in out, out
    warned = "StaleOutputWarning: 99_not_refreshed.ipynb, Cell 1: the saved output is stale"
    assert f"{warned} (line 1: saved 'stdout: 3' / fresh 'stdout: 4')" in out, out


# ---- cells tagged `gpu` -------------------------------------------------------------------------
GPU_SAVED = "ran on NVIDIA H100 80GB HBM3 on 2026-12-06\nflashinfer 3.1 ms, torch 9.4 ms\n"
CPU_FRESH = "not run here: it needs CUDA\n"


def _gpu_pair():
    """A stored notebook whose `gpu` cell holds a GPU run's output, and a fresh run of it on a CPU."""
    stored = new_notebook(cells=[_cell("print(1)", _stdout("1\n")),
                                 _cell("measure()", _stdout(GPU_SAVED), tags=["gpu"]),
                                 _cell("print(2)", _stdout("2\n"))])
    fresh = new_notebook(cells=[_cell("print(1)", _stdout("1\n")),
                                _cell("measure()", _stdout(CPU_FRESH), tags=["gpu"]),
                                _cell("print(2)", _stdout("3\n"))])
    return stored, fresh


def test_a_gpu_cell_is_compared_only_on_a_gpu_machine():
    stored, fresh = _gpu_pair()
    assert [s.cell for s in so.stale_cells(stored, fresh, PATTERNS, on_gpu_machine=False)] == [2]
    assert [s.cell for s in so.stale_cells(stored, fresh, PATTERNS, on_gpu_machine=True)] == [1, 2]


def test_a_refresh_without_a_gpu_keeps_the_saved_gpu_outputs_only():
    """A `gpu` cell's GPU output is kept; one saved with "not run here", or never run, takes the
    fresh output; other cells take theirs."""
    stored, fresh = _gpu_pair()
    assert so.keep_gpu_outputs(stored, fresh) == 1
    assert [c.outputs[0]["text"] for c in fresh.cells] == ["1\n", GPU_SAVED, "3\n"]
    for saved in ([_stdout(CPU_FRESH)], []):
        stored, fresh = _gpu_pair()
        stored.cells[1].outputs = saved
        assert so.keep_gpu_outputs(stored, fresh) == 0 and fresh.cells[1].outputs[0]["text"] == CPU_FRESH


def _gpu_chapter(path: Path) -> None:
    """A chapter whose `gpu` cell saved a GPU output but prints "not run here" here and sets a name
    the next cell prints (so a skipped cell would fail the next), and whose last cell is stale."""
    _write(new_notebook(cells=[
        _cell("ran = 'yes'\nprint('not run here: it needs CUDA')", _stdout(GPU_SAVED), tags=["gpu"]),
        _cell("print(ran)", _stdout("yes\n")),
        _cell("print(2 + 2)", _stdout("3\n")),
    ]), path)


@pytest.mark.skipif(so.ON_GPU_MACHINE, reason="on a machine with a GPU the plugin compares no cell")
def test_under_nbval_a_gpu_cell_runs_and_is_not_compared_without_a_gpu(tmp_path: Path):
    """nbval (lax) and the plugin run the `gpu` cell without comparing its GPU output; the stale
    cell beside it still fails."""
    chapters = _layout(tmp_path)
    _gpu_chapter(chapters / "21_gpu.ipynb")
    out = _nbval(tmp_path, chapters / "21_gpu.ipynb")
    assert "1 failed, 2 passed" in out, out
    assert "FAILED chapters/21_gpu.ipynb::Cell 2" in out and "saved 'stdout: 3' / fresh 'stdout: 4'" in out, out


@pytest.mark.skipif(so.ON_GPU_MACHINE, reason="on a machine with a GPU the fresh outputs are saved as they are")
def test_write_without_a_gpu_keeps_the_gpu_output(tmp_path: Path):
    """`tools/stale_outputs.py NN --write` on a CPU: the stale cell takes its fresh output, the `gpu`
    cell keeps its GPU output, and the notebook is then clean."""
    chapters = _layout(tmp_path)
    _gpu_chapter(chapters / "21_gpu.ipynb")
    tool = [sys.executable, str(tmp_path / "tools" / "stale_outputs.py"), "21"]
    run = subprocess.run([*tool, "--write"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    said = run.stdout + run.stderr
    assert run.returncode == 0 and "1 stale cell" in said, said
    assert "kept the saved GPU outputs of 1 `gpu` cell)" in said, said
    cells = nbformat.read(chapters / "21_gpu.ipynb", as_version=4).cells
    assert [c.outputs[0]["text"] for c in cells] == [GPU_SAVED, "yes\n", "4\n"]
    again = subprocess.run(tool, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "0 stale cells" in again.stdout, again.stdout + again.stderr


def test_under_nbval_a_cell_ending_in_a_semicolon_displays_nothing_as_in_jupyter(tmp_path: Path):
    """nbval's kernel keeps no history, so IPython cannot see the `;` and displays the last value;
    Jupyter does not, and the saved notebook holds no such output. The plugin compares as Jupyter runs."""
    chapters = _layout(tmp_path)
    _write(new_notebook(cells=[_cell("x = 41\nx + 1;"), _cell("print(2 + 2)", _stdout("3\n"))]),
           chapters / "22_quiet.ipynb")
    out = _nbval(tmp_path, chapters / "22_quiet.ipynb")
    assert "1 failed, 1 passed" in out and "FAILED chapters/22_quiet.ipynb::Cell 1" in out, out
