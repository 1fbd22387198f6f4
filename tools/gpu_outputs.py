#!/usr/bin/env python3
"""Put the outputs of a GPU run into the chapters, for the cells that need CUDA.

A code cell that needs CUDA carries the tag `gpu` in its metadata. On a machine without a GPU it
prints "not run here"; on a GPU its first line names the card and the date. The chapters are
saved from a CPU run, except for these cells, whose saved outputs come from a GPU run through
this tool, so a reader without a GPU still sees what they show.

On the GPU machine (the package installed with its `gpu` extra, FlashInfer included):

    python tools/run_notebooks.py 17 18 19 20 --save-dir /tmp/gpu-run

Then, with that folder copied here:

    python tools/gpu_outputs.py --executed /tmp/gpu-run         # every chapter the folder holds
    python tools/gpu_outputs.py 17 20 --executed /tmp/gpu-run   # only these
    python tools/gpu_outputs.py --check                         # `gpu` cells still without a GPU output

Only the outputs of `gpu` cells are copied; every other cell keeps what the CPU run saved. Cells
are matched by cell id, and a notebook is left untouched, with the reason printed, when one of its
`gpu` cells is missing from the executed copy, has another source there (the chapter changed
after the GPU run: run it again), did not run, raised, or still says "not run here" (the GPU
machine lacked CUDA or FlashInfer). The exit status is 1 when anything was refused, or, with
`--check`, when a `gpu` cell has no GPU output or is also tagged `nbval-check-output` (nbval would
then compare its GPU output with a CPU run's).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Dict, List, Mapping, Optional


def _neighbour(name: str) -> ModuleType:
    """A tool of this folder as a module, loaded by its path (the folder is no package, and
    putting it on sys.path would let its files shadow other modules of a test run)."""
    key = f"_{name}_for_gpu_outputs"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, Path(__file__).resolve().parent / f"{name}.py")
        sys.modules[key] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[key]


chapter_notebooks = _neighbour("run_notebooks").chapter_notebooks
_so = _neighbour("stale_outputs")
GPU_TAG, NOT_RUN, REPO, _text, tags = _so.GPU_TAG, _so.NOT_RUN, _so.REPO, _so._text, _so.tags
is_gpu_cell, no_gpu_output, save_notebook = _so.is_gpu_cell, _so.no_gpu_output, _so.save_notebook

CHECK_TAG = "nbval-check-output"


class GpuOutputError(ValueError):
    """An executed notebook whose `gpu` outputs cannot be taken, with the reason."""


def read_executed(path: Path) -> dict:
    """A notebook as `tools/run_notebooks.py --save-dir` wrote it, with texts in lines as stored."""
    import nbformat
    from nbformat.v4.rwbase import split_lines

    return json.loads(json.dumps(split_lines(nbformat.read(path, as_version=4))))


def merge(shipped: dict, executed: Mapping, name: str = "") -> List[str]:
    """Copies the outputs of `shipped`'s `gpu` cells from `executed` (a GPU run of the same chapter)
    into `shipped`, in place; returns the ids of the cells copied. Raises GpuOutputError, with
    `shipped` unchanged, when any of them cannot be taken."""
    by_id: Dict[str, Mapping] = {c.get("id"): c for c in executed["cells"] if c.get("id")}
    copies, refusals = [], []
    for cell in shipped["cells"]:
        if not is_gpu_cell(cell):
            continue
        cid = cell.get("id")
        ran = by_id.get(cid)
        if ran is None:
            refusals.append(f"cell {cid}: not in the executed copy (was the GPU run made from this chapter?)")
        elif _text(ran.get("source")) != _text(cell.get("source")):
            refusals.append(f"cell {cid}: its source differs from the executed copy's: the chapter changed after "
                            "the GPU run; run the notebook on the GPU again")
        elif (why := no_gpu_output(ran)) is not None:
            refusals.append(f"cell {cid}: the executed copy has no GPU output: {why}")
        else:
            copies.append((cell, ran))
    if refusals:
        raise GpuOutputError(f"{name}: nothing copied:\n" + "\n".join(f"  {r}" for r in refusals))
    for cell, ran in copies:
        cell["outputs"] = json.loads(json.dumps(ran["outputs"]))
    return [cell.get("id") for cell, _ in copies]


def check(nb: Mapping) -> List[str]:
    """One line per `gpu` cell of a shipped notebook whose saved output is no GPU output, or which
    nbval would compare on the CPU."""
    lines = []
    for i, cell in enumerate(nb["cells"]):
        if not is_gpu_cell(cell):
            continue
        if (why := no_gpu_output(cell)) is not None:
            lines.append(f"cell {i} ({cell.get('id')}): {why}")
        if CHECK_TAG in tags(cell):
            lines.append(f"cell {i} ({cell.get('id')}): also tagged {CHECK_TAG}: nbval would compare its GPU output "
                         "on the CPU")
    return lines


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("chapters", nargs="*", help="chapter numbers (default: every chapter the folder holds; with "
                                                "--check, every chapter)")
    ap.add_argument("--executed", type=Path, help="folder of the notebooks executed on a GPU machine "
                                                  "(tools/run_notebooks.py --save-dir)")
    ap.add_argument("--check", action="store_true", help=f"list the {GPU_TAG} cells whose saved output is missing or "
                                                         f"says {NOT_RUN!r}; change nothing")
    args = ap.parse_args(argv)
    if args.check == (args.executed is not None):
        ap.error("give either --executed DIR (copy its GPU outputs in) or --check")
    if args.check:
        bad = 0
        for path in chapter_notebooks(args.chapters):
            nb = json.loads(path.read_text())
            count = sum(is_gpu_cell(c) for c in nb["cells"])
            if not count:
                continue
            lines = check(nb)
            print(f"{path.name}: {count} {GPU_TAG} cell{'s' if count != 1 else ''}: "
                  f"{f'{len(lines)} to fix' if lines else 'every one holds a GPU output'}")
            for line in lines:
                print(f"  {line}")
            bad += bool(lines)
        return 1 if bad else 0
    if not args.executed.is_dir():
        ap.error(f"{args.executed} is not a folder")
    paths = chapter_notebooks(args.chapters)
    if not args.chapters:
        paths = [p for p in paths if (args.executed / p.name).is_file()]
        if not paths:
            ap.error(f"{args.executed} holds no chapter notebook (named as in chapters/)")
    merged: Dict[Path, dict] = {}
    refused = []
    for path in paths:
        executed = args.executed / path.name
        if not executed.is_file():
            refused.append(f"{path.name}: no executed copy {executed}")
            continue
        shipped = json.loads(path.read_text())
        try:
            ids = merge(shipped, read_executed(executed), path.name)
        except GpuOutputError as e:
            refused.append(str(e))
            continue
        if ids:
            merged[path] = shipped
            print(f"{path.name}: the GPU outputs of {len(ids)} {GPU_TAG} cell{'s' if len(ids) != 1 else ''} "
                  f"({', '.join(ids)})")
        else:
            print(f"{path.name}: no {GPU_TAG} cells")
    for path, nb in merged.items():
        save_notebook(nb, path)
        print(f"  saved into {path.relative_to(REPO)}")
    for line in refused:
        print(line)
    return 1 if refused else 0


if __name__ == "__main__":
    sys.exit(main())
