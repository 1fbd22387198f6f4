"""Chapters teach, then ask: no chapter shows an exercise's answer before the exercise.

An exercise's answer is the engine code the learner writes: every symbol its declaration
(exercises/<id>/exercise.toml) lists in `replaces` and `optional`. A cell *reveals* an answer when
- it shows engine code (`book.show` / `book.source`, read from the cell's source and from the
  tags on its outputs) whose lines overlap the answer's definition, or
- its text (markdown, code, or any text output) contains lines of the answer's body that
  occur nowhere else in the package (this catches `inspect.getsource`, `??`, pasted code).

The rule, for every exercise of chapter c and every chapter n <= c:
- chapter n < c never reveals it;
- chapter c reveals it only after the exercise's section (a heading naming the exercise in
  backticks, or its `%%judge <id>` cell, whichever comes first), and there only in an answers
  section (a heading with "Answers" or "try the exercise first") or in a cell whose source and
  outputs are both collapsed (`metadata.jupyter.source_hidden` and `outputs_hidden`) or inside a
  markdown `<details>` block.
Chapters after c may show it freely. Each exercise's section also holds a `%%judge <id>` cell.
"""

from __future__ import annotations

import ast
import functools
import html
import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, FrozenSet, Iterator, List, Optional, Tuple

import pytest

from file_module import load_file

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = ROOT / "chapters"
PACKAGE = ROOT / "minisgl"
EXERCISE_IDS = sorted(p.parent.name for p in (ROOT / "exercises").glob("*/cases.py"))
MIN_LINE = 12  # shorter body lines (`return x`, `pass`) say too little to count as a reveal


book = load_file(CHAPTERS / "book.py", "_book_teach_then_ask")
LAST_CHAPTER = max(int(p.name[:2]) for p in CHAPTERS.glob("[0-9][0-9]_*.ipynb"))


@functools.lru_cache(maxsize=None)
def _resolve(target: str, chapter: int):
    """book.source, once per target and chapter (each call re-checks the chapter's stage)."""
    return book.source(target, chapter)


def notebook(n: int) -> Optional[Path]:
    found = sorted(CHAPTERS.glob(f"{n:02d}_*.ipynb"))
    return found[0] if found else None


def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else (value or "")


# ---------------------------------------------------------------------------------------------
# answers


@dataclass(frozen=True)
class Answer:
    symbol: str  # "minisgl.core:Req.extend_len"
    path: str  # as book.source names it: "minisgl/core.py"
    first: int
    last: int
    lines: FrozenSet[str]  # stripped body lines found nowhere else in the package

    def needed(self) -> int:
        """How many of `lines` a text must contain to count as showing the body."""
        return min(2, len(self.lines))


@functools.lru_cache(maxsize=None)
def _package_line_counts() -> Counter:
    counts: Counter = Counter()
    for path in PACKAGE.rglob("*.py"):
        counts.update(line.strip() for line in path.read_text().splitlines())
    return counts


def _body_lines(path: Path, qualname: str) -> List[str]:
    """The statements of a definition without its signature and docstring."""
    tree = ast.parse(path.read_text())
    body = tree.body
    node = None
    for part in qualname.split("."):
        node = next(c for c in body if getattr(c, "name", None) == part)
        body = getattr(node, "body", [])
    stmts = list(getattr(node, "body", []))
    if stmts and isinstance(stmts[0], ast.Expr) and isinstance(getattr(stmts[0], "value", None), ast.Constant):
        stmts = stmts[1:]  # the docstring states the contract, which a chapter may teach
    if not stmts:
        return []
    lines = path.read_text().splitlines()
    return [line.strip() for line in lines[stmts[0].lineno - 1 : node.end_lineno]]


@functools.lru_cache(maxsize=None)
def answers(exercise_id: str) -> Tuple[int, Tuple[Answer, ...]]:
    """The exercise's chapter and the answer symbols it asks for (from its exercise.toml)."""
    from judge import registry

    ex = registry.declared(exercise_id)
    starter = {line.strip() for line in (ROOT / "exercises" / exercise_id / "starter.py").read_text().splitlines()}
    counts = _package_line_counts()
    found = []
    for rep in ex.replaces:
        symbol = f"{rep.module}:{rep.qualname}"
        src = _resolve(symbol, LAST_CHAPTER)
        distinctive = frozenset(
            line
            for line in _body_lines(PACKAGE.parent / src.path, rep.qualname)
            if len(line) >= MIN_LINE and counts[line] == 1 and line not in starter and not line.startswith("#")
        )
        found.append(Answer(symbol, src.path, src.first, src.last, distinctive))
    return ex.chapter, tuple(found)


# ---------------------------------------------------------------------------------------------
# what a cell shows


def _code(source: str) -> str:
    """A code cell's Python, without IPython magics and shell escapes."""
    if source.lstrip().startswith("%%"):
        return ""
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())


def _shown_targets(cell: dict) -> List[str]:
    targets = []
    if cell["cell_type"] != "code":
        return targets
    for out in cell.get("outputs", []):
        tag = out.get("metadata", {}).get("minisgl_show")
        if tag:
            targets.append(tag["target"])
    try:
        tree = ast.parse(_code(_text(cell["source"])))
    except SyntaxError:
        return targets
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in ("show", "source") and isinstance(node.args[0].value, str) and node.args[0].value.startswith("minisgl"):
                targets.append(node.args[0].value)
    return targets


def _strip_html(text: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", text))


def _cell_texts(cell: dict, allow_details: bool) -> Iterator[str]:
    source = _text(cell["source"])
    if cell["cell_type"] == "markdown" and allow_details:
        source = re.sub(r"<details>.*?</details>", "", source, flags=re.S)
    yield source
    for out in cell.get("outputs", []):
        if "text" in out:
            yield _text(out["text"])
        for mime, value in out.get("data", {}).items():
            if mime in ("text/plain", "text/markdown", "text/x-python"):
                yield _text(value)
            elif mime == "text/html":
                yield _strip_html(_text(value))


def reveals(cell: dict, chapter: int, answer: Answer, allow_details: bool = False) -> Optional[str]:
    """Why this cell shows `answer`, or None."""
    for target in _shown_targets(cell):
        try:
            src = _resolve(target, chapter)
        except (LookupError, FileNotFoundError, ValueError):
            continue  # a stale target is test_notebooks_fresh's to report
        if src.path == answer.path and src.first <= answer.last and answer.first <= src.last:
            return f"shows {target!r} ({src.path}:{src.first}-{src.last})"
    if answer.lines:
        for text in _cell_texts(cell, allow_details):
            hits = [line for line in answer.lines if line in text]
            if len(hits) >= answer.needed():
                return f"contains its code, e.g. {hits[0]!r}"
    return None


# ---------------------------------------------------------------------------------------------
# where the exercise is asked, and where answers may go


def _is_judge_cell(cell: dict, exercise_id: str) -> bool:
    first = _text(cell["source"]).lstrip().split("\n", 1)[0].split()
    return cell["cell_type"] == "code" and first[:2] == ["%%judge", exercise_id]


def exercise_section(cells: List[dict], exercise_id: str) -> Optional[int]:
    """Index of the first cell that asks for the exercise: a heading naming it, or its %%judge cell."""
    heading = re.compile(rf"^#{{1,6}} .*`{re.escape(exercise_id)}`", re.M)
    for i, cell in enumerate(cells):
        if _is_judge_cell(cell, exercise_id):
            return i
        if cell["cell_type"] == "markdown" and heading.search(_text(cell["source"])):
            return i
    return None


ANSWERS_HEADING = re.compile(r"^#{1,6} .*(answers?\b|try the exercise first)", re.M | re.I)


def _collapsed(cell: dict) -> bool:
    meta = cell.get("metadata", {}).get("jupyter", {})
    return bool(meta.get("source_hidden")) and bool(meta.get("outputs_hidden"))


def violations(exercise_id: str) -> List[str]:
    chapter, answer_list = answers(exercise_id)
    found = []
    for n in range(0, chapter + 1):
        path = notebook(n)
        if path is None:
            continue
        cells = json.loads(path.read_text())["cells"]
        section = exercise_section(cells, exercise_id) if n == chapter else None
        in_answers = False
        for i, cell in enumerate(cells):
            after = section is not None and i > section
            if after and cell["cell_type"] == "markdown" and ANSWERS_HEADING.search(_text(cell["source"])):
                in_answers = True
            if after and (in_answers or _collapsed(cell)):
                continue
            for answer in answer_list:
                why = reveals(cell, n, answer, allow_details=after)
                if why is None:
                    continue
                if n < chapter:
                    where = f"chapter {chapter} asks for it"
                elif section is None or i < section:
                    where = "before the exercise's section"
                else:
                    where = "after the exercise, but neither in an answers section nor in a collapsed cell"
                found.append(f"{path.name} cell {i} {why}: the answer to {exercise_id} ({answer.symbol}), {where}")
    return found


# ---------------------------------------------------------------------------------------------
# the tests


@pytest.mark.parametrize("exercise_id", EXERCISE_IDS)
def test_no_answer_before_its_exercise(exercise_id: str):
    found = violations(exercise_id)
    assert not found, (
        "teach the contract first (pictures, traces, tables, the invariant); reveal the code after the "
        "exercise, in the answers or in a collapsed cell:\n" + "\n".join(found)
    )


@pytest.mark.parametrize("exercise_id", EXERCISE_IDS)
def test_exercise_has_a_section_and_a_judge_cell(exercise_id: str):
    chapter, _ = answers(exercise_id)
    path = notebook(chapter)
    assert path is not None, f"{exercise_id} belongs to chapter {chapter}, which has no notebook"
    cells = json.loads(path.read_text())["cells"]
    section = exercise_section(cells, exercise_id)
    assert section is not None, f"{path.name}: no section asks for {exercise_id} (a heading naming `{exercise_id}`)"
    judge = [i for i, c in enumerate(cells) if _is_judge_cell(c, exercise_id)]
    assert judge, f"{path.name}: the {exercise_id} section has no `%%judge {exercise_id}` cell with the starter"


@pytest.mark.parametrize("exercise_id", EXERCISE_IDS)
def test_the_detector_sees_each_answer(exercise_id: str):
    """Showing an answer, by symbol or by its text alone, must count as a reveal."""
    chapter, answer_list = answers(exercise_id)
    assert answer_list, f"{exercise_id} replaces nothing"
    for answer in answer_list:
        assert answer.lines, f"{answer.symbol}: no line of its body is distinctive; the text check is blind to it"
        src = _resolve(answer.symbol, LAST_CHAPTER)
        by_symbol = {"cell_type": "code", "source": f'book.show("{answer.symbol}")', "outputs": []}
        by_text = {"cell_type": "code", "source": "import inspect", "outputs": [{"output_type": "stream", "text": src.text}]}
        assert reveals(by_symbol, LAST_CHAPTER, answer), f"book.show({answer.symbol!r}) is not detected"
        assert reveals(by_text, LAST_CHAPTER, answer), f"the printed source of {answer.symbol} is not detected"
        outline = {"cell_type": "markdown", "source": f"`{answer.symbol}` is the exercise; its docstring says what to do.", "outputs": []}
        assert reveals(outline, LAST_CHAPTER, answer) is None
