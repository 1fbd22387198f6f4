#!/usr/bin/env python3
"""Each chapter's peak resident memory: its notebook run top to bottom in a fresh kernel.

    python tools/chapter_memory.py              # every chapters/NN_*.ipynb (`make memory`)
    python tools/chapter_memory.py 07 10        # only these chapters
    python tools/chapter_memory.py --runs 2     # Run All twice in the same kernel, as a learner might
    python tools/chapter_memory.py 05 --cells 3 # and the three cells that raised its memory most
                                                # (always named for a chapter over the limit)

One line a chapter: the kernel's peak resident set (VmHWM, read from /proc when the last cell has
run) and the peak of the kernel together with every process it started (servers, tensor-parallel
ranks, judge workers), sampled every 0.1 s. The exit status is non-zero when a kernel's peak is
over --limit-gb (1.5 GiB by default: five chapters open at once then fit an 8 GB laptop). Linux
only (it reads /proc). The notebooks on disk are never modified.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
from run_notebooks import chapter_notebooks  # noqa: E402  (tools/ is not a package)

GIB = 1 << 30


def _status_kib(pid: int, key: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return 0


def descendants(pid: int) -> List[int]:
    """pid's children, their children, ... (from /proc/<pid>/task/*/children)."""
    out, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                continue
            out += kids
            todo += kids
    return out


class Sampler(threading.Thread):
    """Peak resident set of a process tree, sampled every `every` seconds until stopped."""

    def __init__(self, pid: int, every: float = 0.1):
        super().__init__(daemon=True)
        self.pid, self.every, self.peak_kib = pid, every, 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            total = sum(_status_kib(p, "VmRSS") for p in [self.pid, *descendants(self.pid)])
            self.peak_kib = max(self.peak_kib, total)
            self._stop_event.wait(self.every)

    def stop(self) -> int:
        self._stop_event.set()
        self.join()
        return self.peak_kib


class CellMemory(NamedTuple):
    index: int  # the cell's position in the notebook
    first_line: str
    held: int  # bytes: how much more the kernel holds after the cell than before it
    peak: int  # bytes: how much the cell raised the kernel's peak


def biggest(cells: List[CellMemory], n: int) -> List[CellMemory]:
    """The n cells that raised the kernel's peak most (then: that left it holding most)."""
    return sorted(cells, key=lambda c: (c.peak, c.held), reverse=True)[:n]


def measure(path: Path, runs: int = 1, cell_timeout: int = 600) -> Dict[str, object]:
    """Run a notebook `runs` times in one fresh kernel; its peaks in bytes (`per_run`: the kernel's
    peak so far at the end of each run), what each cell of the first run added (`cells`) and any error."""
    import nbformat
    import zmq
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=cell_timeout, kernel_name="python3", allow_errors=False,
                            resources={"metadata": {"path": str(path.parent)}})
    client.km = client.create_kernel_manager()
    if zmq.has("curve") and client.km.has_trait("transport_encryption"):
        client.km.transport_encryption = "auto"  # as in the lab: encrypted sockets, no warning per kernel
    error, kernel_kib, tree_kib = None, 0, 0
    start = time.perf_counter()
    with client.setup_kernel():
        pid = client.km.provisioner.pid
        sampler = Sampler(pid)
        sampler.start()
        index, per_run, cells = None, [], []
        try:
            for run in range(runs):
                for index, cell in enumerate(nb.cells):
                    before = (_status_kib(pid, "VmRSS"), _status_kib(pid, "VmHWM"))
                    client.execute_cell(cell, index)
                    if run == 0 and cell.cell_type == "code":
                        held, peak = _status_kib(pid, "VmRSS") - before[0], _status_kib(pid, "VmHWM") - before[1]
                        cells.append(CellMemory(index, (cell.source.strip().splitlines() or [""])[0][:60], held * 1024, peak * 1024))
                per_run.append(_status_kib(pid, "VmHWM") * 1024)
        except CellExecutionError as e:
            last = (e.evalue or "").strip().splitlines()
            error = f"cell {index}: {e.ename}: {last[-1] if last else ''}"
        except CellTimeoutError:
            error = f"cell {index}: timed out after {cell_timeout} s"
        except DeadKernelError:
            error = f"cell {index}: the kernel died"
        finally:
            kernel_kib = _status_kib(pid, "VmHWM")
            tree_kib = sampler.stop()
    return {"name": path.stem, "kernel": kernel_kib * 1024, "tree": max(tree_kib, kernel_kib) * 1024,
            "per_run": per_run, "cells": cells, "seconds": time.perf_counter() - start, "error": error}


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("chapters", nargs="*", help="chapter numbers (default: every chapter notebook)")
    ap.add_argument("--runs", type=int, default=1, help="Run All this many times in the same kernel (default 1)")
    ap.add_argument("--limit-gb", type=float, default=1.5, help="a kernel's allowed peak, in GiB (default 1.5)")
    ap.add_argument("--cell-timeout", type=int, default=600, help="seconds one cell may run (default 600)")
    ap.add_argument("--cells", type=int, default=0, metavar="N",
                    help="also name each chapter's N cells that raised its kernel's peak most (default: 3 for a "
                         "chapter over the limit, none for the others)")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error(f"--runs must be at least 1, got {args.runs}")
    notebooks = chapter_notebooks(args.chapters)
    width = max(len(p.stem) for p in notebooks)
    first = "  after run 1" if args.runs > 1 else ""
    print(f"{'chapter':<{width}}{first}  kernel peak  with its processes  seconds", flush=True)
    over = failed = 0
    for path in notebooks:
        r = measure(path, args.runs, args.cell_timeout)
        big = r["kernel"] > args.limit_gb * GIB
        over += big
        failed += r["error"] is not None
        flag = f"  over {args.limit_gb:g} GiB" if big else ""
        run1 = f"  {r['per_run'][0] / GIB:7.2f} GiB" if args.runs > 1 and r["per_run"] else " " * len(first)
        print(f"{r['name']:<{width}}{run1}  {r['kernel'] / GIB:8.2f} GiB  {r['tree'] / GIB:12.2f} GiB"
              f"  {r['seconds']:7.0f}{flag}{'  ' + r['error'] if r['error'] else ''}", flush=True)
        for c in biggest(r["cells"], max(args.cells, 3) if big else args.cells):  # over the limit: say where
            print(f"    cell {c.index:3d}: peak +{c.peak / GIB:.2f} GiB, holds +{c.held / GIB:.2f} GiB  {c.first_line}", flush=True)
    print(f"{len(notebooks)} chapters, {args.runs} run(s) each: {over} over {args.limit_gb:g} GiB, {failed} failed")
    return 1 if over or failed else 0


if __name__ == "__main__":
    sys.exit(main())
