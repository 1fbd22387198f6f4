"""`tools/gpu_outputs.py` puts a GPU run's outputs into the chapters for the cells tagged `gpu`, and
no other: matched by cell id, refused (the chapter untouched) when a cell's source changed or the
run gave no GPU output; `--check` lists the `gpu` cells still without one.

Claims: only `gpu` cells change; every refusal names the cell and why; the shipped chapters'
`gpu` cells are never also compared by nbval; `--check` and the merge work from the command line
on a copy of the layout, and a merged chapter is stored as the chapters are.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from file_module import load_file

REPO = Path(__file__).resolve().parents[1]
go = load_file(REPO / "tools" / "gpu_outputs.py", "_gpu_outputs_under_test")

GPU_TEXT = "ran on NVIDIA H100 80GB HBM3 on 2026-12-06\nflashinfer 3.1 ms, torch 9.4 ms\n"
CPU_TEXT = "not run here: it needs CUDA\n"


def _cell(cid, source, text, tags=()):
    cell = new_code_cell(source, execution_count=1, outputs=[new_output("stream", name="stdout", text=text)])
    cell.id = cid
    if tags:
        cell.metadata["tags"] = list(tags)
    return cell


def _chapter(gpu_text=CPU_TEXT, other_text="1\n", source="measure()"):
    intro = new_markdown_cell("A chapter")
    intro.id = "m1"
    return new_notebook(cells=[intro, _cell("a1", "print(1)", other_text), _cell("g1", source, gpu_text, ["gpu"])])


def _as_dict(nb) -> dict:
    return json.loads(json.dumps(nb))


def test_only_the_gpu_cells_take_the_gpu_run_outputs():
    shipped = _as_dict(_chapter())
    ids = go.merge(shipped, _as_dict(_chapter(GPU_TEXT, other_text="a GPU run's own\n")), "21_x.ipynb")
    assert ids == ["g1"]
    assert shipped["cells"][2]["outputs"][0]["text"] == GPU_TEXT
    assert shipped["cells"][1]["outputs"][0]["text"] == "1\n", "an untagged cell keeps what the CPU run saved"
    assert go.check(shipped) == []


@pytest.mark.parametrize("executed, why", [
    (_chapter(GPU_TEXT, source="measure(steps=64)"), "its source differs"),
    (_chapter(CPU_TEXT), "it says 'not run here'"),
    (new_notebook(cells=[]), "not in the executed copy"),
])
def test_a_gpu_cell_that_cannot_be_taken_is_refused_and_nothing_changes(executed, why):
    shipped = _as_dict(_chapter())
    before = json.dumps(shipped)
    with pytest.raises(go.GpuOutputError, match=f"21_x.ipynb: nothing copied:\n  cell g1: .*{why}"):
        go.merge(shipped, _as_dict(executed), "21_x.ipynb")
    assert json.dumps(shipped) == before


def test_a_run_that_stopped_or_raised_is_refused():
    executed = _as_dict(_chapter(GPU_TEXT))
    executed["cells"][2]["outputs"] = [new_output("error", ename="RuntimeError", evalue="CUDA error", traceback=[])]
    with pytest.raises(go.GpuOutputError, match="it raised RuntimeError: CUDA error"):
        go.merge(_as_dict(_chapter()), executed)
    executed["cells"][2].update(outputs=[], execution_count=None)  # nbclient stopped before it
    with pytest.raises(go.GpuOutputError, match=r"no output \(not run\)"):
        go.merge(_as_dict(_chapter()), executed)


def test_check_names_gpu_cells_without_a_gpu_output_and_those_nbval_would_compare():
    shipped = _as_dict(_chapter())
    assert go.check(shipped) == ["cell 2 (g1): it says 'not run here'"]
    shipped["cells"][2]["metadata"]["tags"].append("nbval-check-output")
    assert "also tagged nbval-check-output" in go.check(shipped)[1]


def test_no_chapter_gpu_cell_is_compared_by_nbval():
    """nbval runs lax: a `gpu` cell is compared only if also tagged nbval-check-output, and then its
    GPU output would fail every CPU run. Chapters 17, 18 and 20 have `gpu` cells."""
    found = {}
    for path in sorted((REPO / "chapters").glob("[0-9][0-9]_*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        gpu = [c for c in cells if go.is_gpu_cell(c)]
        if gpu:
            found[path.name[:2]] = [c for c in gpu if go.CHECK_TAG in c["metadata"]["tags"]]
    assert {"17", "18", "20"} <= set(found), found
    assert not any(found.values()), {k: [c["id"] for c in v] for k, v in found.items() if v}


def test_the_command_merges_a_gpu_run_and_then_checks_clean(tmp_path: Path):
    """On a copy of the layout: --check fails on the CPU-saved chapter, the merge from a folder of
    executed copies (as tools/run_notebooks.py --save-dir writes them) fixes it, stored as the
    chapters are; a second executed copy with a changed source is refused."""
    (tmp_path / "tools").mkdir()
    for tool in ("stale_outputs.py", "run_notebooks.py", "gpu_outputs.py"):
        shutil.copy(REPO / "tools" / tool, tmp_path / "tools")
    (tmp_path / "chapters").mkdir()
    stale = load_file(tmp_path / "tools" / "stale_outputs.py", "_stale_outputs_for_gpu_outputs")
    chapter = tmp_path / "chapters" / "21_x.ipynb"
    stale.save_notebook(_as_dict(_chapter()), chapter)
    executed = tmp_path / "gpu-run"
    executed.mkdir()
    nbformat.write(_chapter(GPU_TEXT), executed / "21_x.ipynb")
    tool = [sys.executable, str(tmp_path / "tools" / "gpu_outputs.py")]

    def run(*args):
        done = subprocess.run([*tool, *args], cwd=tmp_path, capture_output=True, text=True, timeout=60)
        return done.returncode, done.stdout + done.stderr

    code, out = run("--check")
    assert code == 1 and "21_x.ipynb: 1 gpu cell: 1 to fix" in out and "cell 2 (g1): it says 'not run here'" in out, out
    code, out = run("--executed", str(executed))
    assert code == 0 and "21_x.ipynb: the GPU outputs of 1 gpu cell (g1)" in out, out
    text = chapter.read_text()
    nb = json.loads(text)
    assert "".join(nb["cells"][2]["outputs"][0]["text"]) == GPU_TEXT
    assert text == json.dumps(stale._stored_order(nb), indent=1, ensure_ascii=False) + "\n"
    code, out = run("--check", "21")
    assert code == 0 and "every one holds a GPU output" in out, out
    nbformat.write(_chapter(GPU_TEXT, source="measure(steps=64)"), executed / "21_x.ipynb")
    code, out = run("21", "--executed", str(executed))
    assert code == 1 and "cell g1: its source differs" in out and chapter.read_text() == text, out
    code, out = run()
    assert code == 2 and "give either --executed DIR" in out, out
