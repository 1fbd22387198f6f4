#!/usr/bin/env python3
"""Find the saved outputs of chapter notebooks that a fresh run no longer prints.

    python tools/stale_outputs.py 01 15          # execute these chapters, list their stale cells
    python tools/stale_outputs.py                # every chapter (long)
    python tools/stale_outputs.py 22 --write     # ... and save the fresh outputs into the chapter
    python tools/stale_outputs.py 22 --fresh /tmp/executed    # compare with copies already executed
                                                              # (tools/run_notebooks.py --save-dir)

What is compared, cell by cell: every code cell's text (stream text; `text/markdown`, else
`text/plain`, else `text/html`; and errors), after the replacements of
`chapters/nbval_sanitize.cfg`, so timings, rates, addresses, absolute paths and the highlighted
HTML of `book.show` do not count. Not compared: images, figures' reprs (`<Figure size ...>`: a
kernel may send a figure once or twice) and widget views, cells tagged `nbval-skip`
(never run by the tests) and cells tagged `nbval-ignore-output` (output that depends on the
machine by design: a timing without a unit, a figure saved from a GPU run). The exit status is 1
when a cell is stale or a notebook fails to run.

Cells tagged `gpu` need CUDA: their saved outputs come from a GPU run (copied in by
`tools/gpu_outputs.py`), and on a machine without one they print "not run here". There they are
run but not compared, and `--write` keeps their saved outputs, so a CPU refresh never wipes the
GPU results.

The same comparison runs inside the test suite's nbval run (`chapters/conftest.py`), on the outputs
nbval has just produced, so the suite never executes a notebook twice.
"""

from __future__ import annotations

import argparse
import configparser
import json
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, List, Mapping, Optional, Sequence, Tuple

REPO = Path(__file__).resolve().parents[1]
CHAPTERS = REPO / "chapters"
SANITIZE_CFG = CHAPTERS / "nbval_sanitize.cfg"
IGNORE_TAGS = frozenset({"nbval-skip", "nbval-ignore-output"})
GPU_TAG = "gpu"  # a code cell that needs CUDA; its saved output is a GPU run's (tools/gpu_outputs.py)
ON_GPU_MACHINE = shutil.which("nvidia-smi") is not None  # as the Makefile decides it
NOT_RUN = "not run here"  # what a `gpu` cell prints where it cannot run (chapters/stage4.py)
SKIPPED_MIME = ("image/", "application/vnd.jupyter.widget")
FIGURE = re.compile(r"<Figure size \d+x\d+ with \d+ Axes>$")

Patterns = List[Tuple[str, str]]


def load_patterns(path: Path = SANITIZE_CFG) -> Patterns:
    """The (regex, replacement) pairs of an nbval sanitize file, in file order."""
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(path)
    return [(parser[s]["regex"], parser[s]["replace"]) for s in parser.sections()]


def sanitize(text: str, patterns: Patterns) -> str:
    for regex, replace in patterns:
        text = re.sub(regex, replace, text)
    return text


def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else (value or "")


def comparable(outputs: Iterable[Mapping], patterns: Patterns) -> List[str]:
    """A cell's outputs as the texts that are compared: each stream's text joined (a kernel may cut
    a stream into chunks anywhere), then each rich output's text form, then errors."""
    streams: dict = {}
    rich: List[str] = []
    for out in outputs:
        kind = out.get("output_type")
        if kind == "stream":
            streams[out.get("name", "stdout")] = streams.get(out.get("name", "stdout"), "") + _text(out.get("text"))
        elif kind in ("execute_result", "display_data"):
            data = out.get("data", {})
            if any(k.startswith(SKIPPED_MIME) for k in data) or FIGURE.match(_text(data.get("text/plain"))):
                continue  # a picture, or a figure's repr: how many a kernel sends is not the chapter's claim
            for mime in ("text/markdown", "text/plain", "text/html"):  # a Markdown object's plain text is only its repr
                if mime in data:
                    rich.append(f"{mime}: {_text(data[mime])}")
                    break
        elif kind == "error":
            rich.append(f"error: {out.get('ename')}: {out.get('evalue')}")
    texts = [f"{name}: {text}" for name, text in sorted(streams.items())] + rich
    return [sanitize(t, patterns) for t in texts]


def first_difference(stored: Sequence[str], fresh: Sequence[str]) -> Optional[str]:
    """None when the two agree, else the first line that differs, as `saved ... / fresh ...`."""
    if list(stored) == list(fresh):
        return None
    a, b = "\n".join(stored).splitlines(), "\n".join(fresh).splitlines()
    for i in range(max(len(a), len(b))):
        x = a[i] if i < len(a) else "(nothing)"
        y = b[i] if i < len(b) else "(nothing)"
        if x != y:
            return f"line {i + 1}: saved {x[:160]!r} / fresh {y[:160]!r}"
    return "the outputs differ in how they are split"


def tags(cell: Mapping) -> set:
    return set(cell.get("metadata", {}).get("tags", []))


def is_gpu_cell(cell: Mapping) -> bool:
    return cell.get("cell_type") == "code" and GPU_TAG in tags(cell)


def checked(cell: Mapping, on_gpu_machine: bool = ON_GPU_MACHINE) -> bool:
    """Whether a code cell's saved output is compared at all. A `gpu` cell's is not where there is
    no GPU: it was saved from a GPU run, and a run here prints "not run here"."""
    if is_gpu_cell(cell) and not on_gpu_machine:
        return False
    return cell.get("cell_type") == "code" and not tags(cell) & IGNORE_TAGS and cell.get("execution_count") is not None


@dataclass(frozen=True)
class Stale:
    cell: int  # index among all cells of the notebook
    difference: str

    def line(self) -> str:
        return f"cell {self.cell}: {self.difference}"


def _same_cells(stored_nb: Mapping, fresh_nb: Mapping) -> None:
    if [_text(c.get("source")) for c in stored_nb["cells"]] != [_text(c.get("source")) for c in fresh_nb["cells"]]:
        raise ValueError("the two notebooks do not have the same cells")


def stale_cells(stored_nb: Mapping, fresh_nb: Mapping, patterns: Optional[Patterns] = None,
                on_gpu_machine: bool = ON_GPU_MACHINE) -> List[Stale]:
    """The cells of `stored_nb` whose saved outputs `fresh_nb` (the same notebook, executed) does not
    reproduce. The two must have the same cells (a fresh run of the stored notebook)."""
    patterns = load_patterns() if patterns is None else patterns
    _same_cells(stored_nb, fresh_nb)
    found = []
    for i, (s, f) in enumerate(zip(stored_nb["cells"], fresh_nb["cells"])):
        if not checked(s, on_gpu_machine):
            continue
        diff = first_difference(comparable(s.get("outputs", []), patterns), comparable(f.get("outputs", []), patterns))
        if diff is not None:
            found.append(Stale(i, diff))
    return found


def _output_text(cell: Mapping) -> str:
    """Every text a cell printed or showed, errors included, for searching."""
    parts = []
    for out in cell.get("outputs", []):
        parts.append(_text(out.get("text")))
        parts += [_text(v) for k, v in out.get("data", {}).items() if k.startswith("text/")]
        if out.get("output_type") == "error":
            parts.append(f"{out.get('ename')}: {out.get('evalue')}")
    return "\n".join(parts)


def no_gpu_output(cell: Mapping) -> Optional[str]:
    """Why a `gpu` cell's saved output is no GPU output, or None when it is one."""
    if cell.get("execution_count") is None or not cell.get("outputs"):
        return "no output (not run)"
    if any(out.get("output_type") == "error" for out in cell["outputs"]):
        error = next(out for out in cell["outputs"] if out.get("output_type") == "error")
        return f"it raised {error.get('ename')}: {str(error.get('evalue'))[:160]}"
    if NOT_RUN in _output_text(cell):
        return f"it says {NOT_RUN!r}"
    return None


def keep_gpu_outputs(stored_nb: Mapping, fresh_nb: dict) -> int:
    """Puts the saved GPU outputs of `stored_nb`'s `gpu` cells back into `fresh_nb` (a run of it on
    a machine without a GPU, where those cells printed "not run here"); returns how many. A `gpu`
    cell saved without a GPU output keeps the fresh one, which says why it did not run."""
    _same_cells(stored_nb, fresh_nb)
    kept = 0
    for s, f in zip(stored_nb["cells"], fresh_nb["cells"]):
        if is_gpu_cell(s) and no_gpu_output(s) is None:
            f["outputs"], f["execution_count"] = s.get("outputs", []), s.get("execution_count")
            kept += 1
    return kept


def _stored_order(value, key: str = ""):
    """Keys sorted, as nbformat writes them, except an output's mime bundle (`data`), which keeps
    the kernel's order (plain text first), as the chapters are stored."""
    if isinstance(value, dict):
        keys = list(value) if key == "data" else sorted(value)
        return {k: _stored_order(value[k], k) for k in keys}
    if isinstance(value, list):
        return [_stored_order(v) for v in value]
    return value


def save_notebook(nb: Mapping, path: Path) -> None:
    """As the chapters are stored: one-space indent, keys sorted but for the mime bundles."""
    path.write_text(json.dumps(_stored_order(nb), indent=1, ensure_ascii=False) + "\n")


def execute(path: Path, cell_timeout: int = 600, kernel: str = "python3") -> Tuple[Optional[dict], Optional[str]]:
    """`path` run top to bottom in a fresh kernel, in the chapters' folder: (notebook, None), or
    (None, the first error)."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=cell_timeout, kernel_name=kernel, allow_errors=False,
                            resources={"metadata": {"path": str(path.parent)}})
    try:
        client.execute()
    except CellExecutionError as e:
        return None, f"{e.ename}: {(e.evalue or '').strip().splitlines()[-1:]}"
    except (CellTimeoutError, DeadKernelError) as e:
        return None, f"{type(e).__name__}: {str(e).strip().splitlines()[-1:]}"
    from nbformat.v4.rwbase import split_lines

    return json.loads(json.dumps(split_lines(nb))), None  # as stored: texts in lines, keys in the kernel's order


def main(argv: Optional[List[str]] = None) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from run_notebooks import chapter_notebooks

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("chapters", nargs="*", help="chapter numbers (default: every chapter notebook)")
    ap.add_argument("--fresh", type=Path, help="a folder of executed copies to compare with, instead of running")
    ap.add_argument("--write", action="store_true", help="save each clean fresh run's outputs into its chapter")
    ap.add_argument("--cell-timeout", type=int, default=600, help="seconds one cell may run (default 600)")
    ap.add_argument("--kernel", default="python3", help="Jupyter kernel name (default python3)")
    args = ap.parse_args(argv)

    patterns = load_patterns()
    bad = 0
    for path in chapter_notebooks(args.chapters):
        if args.fresh is not None:
            fresh = json.loads((args.fresh / path.name).read_text())
        else:
            fresh, error = execute(path, args.cell_timeout, args.kernel)
            if fresh is None:
                print(f"{path.name}: did not run: {error}")
                bad += 1
                continue
        stored = json.loads(path.read_text())
        found = stale_cells(stored, fresh, patterns)
        print(f"{path.name}: {len(found)} stale cell{'s' if len(found) != 1 else ''}", flush=True)
        for s in found:
            print(f"  {s.line()}")
        if args.write and args.fresh is None:
            kept = 0 if ON_GPU_MACHINE else keep_gpu_outputs(stored, fresh)
            save_notebook(fresh, path)
            plural = "s" if kept != 1 else ""
            print(f"  saved the fresh outputs into {path.relative_to(REPO)}"
                  + (f" (kept the saved GPU outputs of {kept} `{GPU_TAG}` cell{plural})" if kept else ""))
        elif found:
            bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
