#!/usr/bin/env python3
"""Execute every chapter notebook top to bottom, each in a fresh kernel, and print one line each.

    python tools/run_notebooks.py                    # every chapters/NN_*.ipynb
    python tools/run_notebooks.py 06 17              # only these chapters
    python tools/run_notebooks.py --cell-timeout 600 --save-dir /tmp/executed
    python tools/run_notebooks.py --jobs 4           # four notebooks at a time (a roomy machine)

Each line says `ok` or the first error (its cell index, the exception and its message) and the
seconds the notebook took, as each finishes; the table in chapter order closes the run. The exit
status is non-zero when any notebook failed. Nothing is
compared with the stored outputs (that is what `make test` does through nbval on the CPU): this
answers "does every chapter run here", for instance on a GPU machine (`tools/gpu_check.sh`).
The notebooks on disk are never modified; `--save-dir` keeps the executed copies.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

REPO = Path(__file__).resolve().parents[1]
CHAPTERS = REPO / "chapters"


@dataclass
class NotebookResult:
    name: str
    seconds: float
    error: Optional[str] = None  # "cell 12: ValueError: ..." or None when every cell ran

    @property
    def ok(self) -> bool:
        return self.error is None

    def line(self, width: int) -> str:
        return f"{self.name:<{width}}  {'ok' if self.ok else 'FAIL':<4}  {self.seconds:7.1f}s  {self.error or ''}".rstrip()


def chapter_notebooks(only: List[str]) -> List[Path]:
    found = sorted(CHAPTERS.glob("[0-9][0-9]_*.ipynb"))
    if not only:
        return found
    wanted = {o.zfill(2) for o in only}
    picked = [p for p in found if p.name[:2] in wanted]
    missing = wanted - {p.name[:2] for p in picked}
    if missing:
        raise SystemExit(f"no chapter notebook for {sorted(missing)} in {CHAPTERS}")
    return picked


def _first_line(text: str, limit: int = 240) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    line = lines[-1] if lines else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def run_notebook(path: Path, cell_timeout: int, kernel: str, save_dir: Optional[Path]) -> NotebookResult:
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=cell_timeout, kernel_name=kernel, allow_errors=False,
                            resources={"metadata": {"path": str(path.parent)}})
    current = {"cell": None}

    def on_cell_start(cell, cell_index):
        current["cell"] = cell_index

    client.on_cell_start = on_cell_start
    start = time.perf_counter()
    error = None
    try:
        client.execute()
    except CellExecutionError as e:
        error = f"cell {current['cell']}: {e.ename}: {_first_line(e.evalue or '')}"
    except CellTimeoutError:
        error = f"cell {current['cell']}: timed out after {cell_timeout} s"
    except DeadKernelError as e:
        error = f"cell {current['cell']}: the kernel died ({_first_line(str(e))})"
    seconds = time.perf_counter() - start
    if save_dir is not None:
        save_dir.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, save_dir / path.name)
    return NotebookResult(path.stem, seconds, error)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("chapters", nargs="*", help="chapter numbers (default: every chapter notebook)")
    ap.add_argument("--cell-timeout", type=int, default=600, help="seconds one cell may run (default 600)")
    ap.add_argument("--kernel", default="python3", help="Jupyter kernel name (default python3)")
    ap.add_argument("--save-dir", type=Path, help="also write the executed notebooks here")
    ap.add_argument("--jobs", type=int, default=1, help="notebooks executed at the same time (default 1)")
    args = ap.parse_args(argv)
    if args.jobs < 1:
        ap.error(f"--jobs must be at least 1, got {args.jobs}")

    notebooks = chapter_notebooks(args.chapters)
    width = max(len(p.stem) for p in notebooks)
    run = functools.partial(run_notebook, cell_timeout=args.cell_timeout, kernel=args.kernel, save_dir=args.save_dir)
    start = time.perf_counter()
    results = []
    if args.jobs == 1:
        for path in notebooks:
            results.append(run(path))
            print(results[-1].line(width), flush=True)
    else:
        # each notebook has its own kernel process anyway; a process per client keeps their event loops apart
        with concurrent.futures.ProcessPoolExecutor(args.jobs) as pool:
            for future in concurrent.futures.as_completed([pool.submit(run, p) for p in notebooks]):
                results.append(future.result())
                print(results[-1].line(width), flush=True)
        results.sort(key=lambda r: r.name)
        print("\nin chapter order:")
        for r in results:
            print(r.line(width))
    failed = [r for r in results if not r.ok]
    print(f"{len(results) - len(failed)}/{len(results)} notebooks ran without an error "
          f"({time.perf_counter() - start:.0f} s wall, {sum(r.seconds for r in results):.0f} s summed)", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
