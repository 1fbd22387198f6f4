"""Opening a chapter in JupyterLab must not modify it: its kernel metadata is what the lab writes."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from file_module import load_file

REPO = Path(__file__).resolve().parents[1]
meta = load_file(REPO / "tools" / "notebook_metadata.py", "_notebook_metadata_under_test")


def test_every_chapter_is_checked():
    names = [p.name for p in meta.notebooks()]
    assert "index.ipynb" in names and "00_tiny_engine.ipynb" in names


@pytest.mark.parametrize("path", meta.notebooks(), ids=lambda p: p.name)
def test_kernel_metadata_is_what_the_lab_writes(path):
    found = meta.problems(nbformat.read(path, as_version=4))
    assert not found, f"{path.name}: " + "; ".join(found) + " -- run `python tools/notebook_metadata.py`"


def test_expected_metadata_matches_the_installed_kernel():
    """The constants in tools/notebook_metadata.py are what this environment's kernel declares."""
    from ipykernel.ipkernel import IPythonKernel
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec(meta.KERNELSPEC["name"])
    assert {"display_name": spec.display_name, "language": spec.language, "name": meta.KERNELSPEC["name"]} == meta.KERNELSPEC
    reported = {k: v for k, v in IPythonKernel.language_info.items() if k != "version"}
    assert reported == meta.LANGUAGE_INFO


def test_check_mode_reports_a_stale_kernelspec(tmp_path):
    nb = nbformat.read(REPO / "chapters" / "index.ipynb", as_version=4)
    nb.metadata["kernelspec"]["display_name"] = "Python 3"
    stale = tmp_path / "stale.ipynb"
    nbformat.write(nb, stale)
    assert meta.main(["--check", str(stale)]) == 1
    assert meta.main([str(stale)]) == 0
    fixed = nbformat.read(stale, as_version=4)
    assert meta.problems(fixed) == []
    assert [c.source for c in fixed.cells] == [c.source for c in nb.cells]  # only metadata changed
