"""tools/run_notebooks.py: each notebook in a fresh kernel, one line each, the first error named."""

from __future__ import annotations

from pathlib import Path

import pytest

from file_module import load_file

ROOT = Path(__file__).resolve().parent.parent
nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")


runner = load_file(ROOT / "tools" / "run_notebooks.py", "_run_notebooks_under_test")


def _notebook(path: Path, *sources: str) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# a title")] + [nbformat.v4.new_code_cell(s) for s in sources]
    nbformat.write(nb, path)
    return path


def test_first_error_is_reported_with_its_cell_index(tmp_path):
    path = _notebook(tmp_path / "01_x.ipynb", "x = 1", "raise ValueError('cpu tensor?')", "raise KeyError('never reached')")
    result = runner.run_notebook(path, cell_timeout=60, kernel="python3", save_dir=tmp_path / "out")
    assert not result.ok
    assert result.error == "cell 2: ValueError: cpu tensor?"
    assert "FAIL" in result.line(8) and result.seconds > 0
    assert (tmp_path / "out" / "01_x.ipynb").is_file()
    assert nbformat.read(path, as_version=4).cells[1].get("outputs") == [], "the notebook on disk is left alone"


def test_a_fresh_kernel_each_and_the_cell_time_limit(tmp_path):
    ok = runner.run_notebook(_notebook(tmp_path / "02_ok.ipynb", "assert 'x' not in globals()", "x = 2"), 60, "python3", None)
    assert ok.ok and ok.error is None and ok.line(8).split()[1] == "ok"
    slow = runner.run_notebook(_notebook(tmp_path / "03_slow.ipynb", "import time; time.sleep(30)"), 2, "python3", None)
    assert slow.error == "cell 1: timed out after 2 s"


def test_unknown_chapter_is_a_usage_error():
    with pytest.raises(SystemExit, match="no chapter notebook"):
        runner.chapter_notebooks(["99"])
