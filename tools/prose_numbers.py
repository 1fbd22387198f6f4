"""The numbers a chapter's prose states, and whether each is printed by a cell or declared.

The workbook's rule: every number in a chapter's markdown is printed or formatted by a code cell
of that chapter, or declared in `tools/prose_numbers.toml` with where its truth comes from. This
module finds them; `tests/test_prose_numbers.py` fails on any that is neither, and on any
declaration whose source no longer gives the number as written.

What counts as a number (the rule, applied to every markdown cell of `chapters/NN_*.ipynb`):

- A run of digits standing alone: `12`, `12,000`, `0.05`, `-100.0`, also as a factor (`x1.9`,
  `1.9x`, `1.9×`) or a percentage (`69%`). Digits inside a word are part of a name, not a number
  (`float32`, `H200`, `uid6`, `Qwen2.5`, `2D`, `top-5`, `GPT-2`), and so are numbers written as
  words ("two rows").
- Left out, because they state no fact about the engine or a measurement:
  - code: fenced blocks and inline code spans (they show code, which other tests check);
  - the structure of the book: a heading's own numbering (`## 4. Experiment`), a numbered list's
    markers (`1. ...`), and references: a number or a list of numbers (`4 to 18`, `9, 10 and 11`)
    right after chapter(s), section(s), exercise(s), stage(s), question(s), hint(s), answer(s),
    part(s), figure(s) or cell(s), and the cells of a table column headed "chapter(s)";
  - a question's givens: from a heading `Self-test`, `Exercises` or `Questions` (numbered or
    not) to the next answers block, `<details>` (a question sets up its own case; its answer is
    scanned), and in answer k (the answers block's item k) a number that question k states;
  - link targets, HTML tags and URLs;
  - dates (`2026-12-04`) and years: a four-digit number from 1990 to 2039 with no unit after it;
  - the reader's own arithmetic: `$...$` math inside an answers block (`<details>` to
    `</details>`); math elsewhere is scanned like prose.

A number is accounted for when (one of)
  (a) it is printed: its text (thousands commas dropped) appears, as a whole number, in the saved
      output of some code cell of the same chapter; or
  (b) it is the input of the code next to it: the code cell right above or right below the
      markdown cell spells it out as a literal in its source (`-100.0` for -100, `20_000` for
      20,000), so the number the prose names is the one the code runs; or
  (c) a declaration for that chapter names its text and a phrase of the prose around it (`near`)
      that contains it (as the markdown has it, code spans included), and gives its source: `code` (a `module:NAME` to import), `expr` (a Python
      expression, evaluated with `minisgl` importable), `json` (`path/to/file.json:key.key.0`),
      `test` (`tests/file.py::name`: a test whose source contains the number as written) or
      `definition` (true by definition; the value is a one-line reason). `scale` multiplies a
      source's value before it is compared (100 for a fraction written as a percentage).
      A value compares with the number rounded as the prose rounds it: to its decimals.
"""

from __future__ import annotations

import json
import re
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

REPO = Path(__file__).resolve().parents[1]
DECLARATIONS = REPO / "tools" / "prose_numbers.toml"

# a number: optional sign (not after a word or a hyphenated name), digits with thousands commas,
# decimals; an `x` or `×` before it only as a factor
NUMBER = re.compile(r"(?:(?<![\w.\-])-|(?<![\w.\-])(?:x|×)|(?<![\w.\-]))(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(?:(?=[x×](?!\w))|(?![\w]|\.\d|,\d{3}))")
REFERENCE_WORDS = r"(?:chapters?|sections?|exercises?|stages?|questions?|hints?|answers?|parts?|figures?|cells?)"
REFERENCE = re.compile(REFERENCE_WORDS + r"\s+\d+(?:\s*(?:,|and|to|or|-|–)\s*\d+)*", re.IGNORECASE)
UNIT_AFTER = re.compile(r"\s*(?:%|x\b|×|[a-zA-Zµ])")
DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}(?:[T ][\d:.]+Z?)?\b")


@dataclass(frozen=True)
class Number:
    chapter: str  # "22"
    cell: int  # index of the markdown cell
    text: str  # as written, sign included, without a leading factor mark
    context: str  # the cleaned prose line it stands in
    start: int = 0  # offset of the number in the cell's markdown (cleaning keeps offsets)
    markdown: str = ""  # the cell's markdown

    @property
    def plain(self) -> str:
        return self.text.replace(",", "")


def _blank(text: str, pattern: "re.Pattern[str] | str", flags: int = 0) -> str:
    """Replace every match with spaces (of the same length, so positions stay put)."""
    return re.sub(pattern, lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=flags)


def _blank_chapter_columns(text: str) -> str:
    """Blank the cells of every markdown table column whose header names chapters."""
    lines = text.split("\n")
    columns: List[int] = []
    for i, line in enumerate(lines):
        if not line.lstrip().startswith("|"):
            columns = []
            continue
        cells = line.split("|")
        if not columns and i + 1 < len(lines) and re.match(r"\s*\|[\s:|-]+\|\s*$", lines[i + 1]):
            columns = [j for j, c in enumerate(cells) if re.fullmatch(r"\s*chapters?\s*", c, re.I)]
            continue
        for j in columns:
            if j < len(cells):
                cells[j] = " " * len(cells[j])
        lines[i] = "|".join(cells)
    return "\n".join(lines)


def _items(text: str) -> Dict[str, Tuple[int, int]]:
    """Numbered list items of `text`: number -> (start, end) of the item's text."""
    starts = [(m.group(1), m.start()) for m in re.finditer(r"(?m)^[ \t]*(\d+)\.[ \t]", text)]
    return {k: (a, starts[i + 1][1] if i + 1 < len(starts) else len(text)) for i, (k, a) in enumerate(starts)}


def _blank_givens(block: str) -> str:
    """`block`: questions, then maybe their answers (`<details>`). Blank the questions, and in
    answer k every number that question k states."""
    cut = block.find("<details>")
    questions, answers = (block, "") if cut < 0 else (block[:cut], block[cut:])
    givens = {k: {m.group(0).replace(",", "") for m in re.finditer(r"\d[\d,]*(?:\.\d+)?", questions[a:b])}
              for k, (a, b) in _items(questions).items()}
    out = list(answers)
    for k, (a, b) in _items(answers).items():
        for m in re.finditer(r"(?<![\w.])\d[\d,]*(?:\.\d+)?(?![\w])", answers[a:b]):
            if m.group(0).replace(",", "") in givens.get(k, ()) and m.start() > 0 and not answers[a:a + m.end()].lstrip().endswith(k + "."):
                out[a + m.start():a + m.end()] = " " * (m.end() - m.start())
    return _blank(questions, r"\S+") + "".join(out)


def clean(markdown: str) -> str:
    """The markdown with everything that is not scanned blanked out (see the module's rule)."""
    text = _blank(markdown, r"```.*?```", re.S)
    text = _blank(text, r"<!--.*?-->", re.S)
    # the reader's arithmetic: math inside an answers block
    text = re.sub(r"<details>.*?(?:</details>|\Z)", lambda m: _blank(m.group(0), r"\$\$.*?\$\$|\$[^$\n]+\$", re.S), text, flags=re.S)
    text = _blank(text, r"`[^`\n]*`")
    text = _blank(text, r"\]\([^)]*\)")
    text = _blank(text, r"https?://\S+")
    text = _blank(text, r"<[^>\n]+>")
    text = _blank(text, DATE)
    text = _blank(text, REFERENCE)
    text = _blank_chapter_columns(text)
    text = _blank(text, r"(?m)^(\s*#+\s*)\d+(?:\.\d+)*\.?")
    text = _blank(text, r"(?m)^\s*\d+[.)]\s")
    # a range written with a dash: both ends are numbers
    text = re.sub(r"(?<=\d)[-–](?=\d)", " ", text)
    # a question's givens, found on the markdown as written (list markers and <details> intact)
    givens = re.sub(r"(?m)^#+[ \t]*(?:[\d.]+[ \t]*)?(?:Self-test|Exercises|Questions)\b.*?(?:<details>.*?(?:</details>|\Z)|\Z)",
                    lambda m: _blank_givens(m.group(0)), markdown, flags=re.S)
    text = "".join(" " if g == " " and c != "\n" else c for c, g in zip(text, givens))
    return text


def numbers_in(markdown: str, chapter: str = "", cell: int = 0) -> List[Number]:
    """The numbers `markdown` states, by the module's rule."""
    text = clean(markdown)
    found = []
    for m in NUMBER.finditer(text):
        whole = m.group(1) + (m.group(2) or "")
        sign = "-" if m.group(0).startswith("-") else ""
        after = text[m.end():m.end() + 3]
        if re.fullmatch(r"(?:199\d|20[0-3]\d)", whole) and not UNIT_AFTER.match(after):
            continue  # a year
        line_start = text.rfind("\n", 0, m.start()) + 1
        line_end = text.find("\n", m.end())
        context = " ".join(text[line_start:line_end if line_end >= 0 else None].split())
        found.append(Number(chapter, cell, sign + whole, context, m.start(), markdown))
    return found


def chapter_files(root: Path = REPO / "chapters") -> List[Path]:
    return sorted(root.glob("[0-9][0-9]_*.ipynb"))


def _output_text(cell: dict) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if "text" in out:
            parts.append("".join(out["text"]))
        for kind in ("text/plain", "text/markdown", "text/html"):
            if kind in out.get("data", {}):
                parts.append("".join(out["data"][kind]))
    return "\n".join(parts)


def printed_numbers(nb: dict) -> set:
    """Every number the chapter's saved outputs print, unsigned, thousands commas dropped. As in
    prose, digits inside a name (`uid6`, `float32`) are not a number; an `x` may lead a factor."""
    text = "\n".join(_output_text(c) for c in nb["cells"] if c["cell_type"] == "code")
    pattern = r"(?<![A-Za-wyz\d.,])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
    return {m.group(0).replace(",", "") for m in re.finditer(pattern, text)}


def code_literals(cell: Optional[dict]) -> set:
    """The numeric literals a code cell's source spells out, as numbers (unsigned)."""
    if cell is None or cell["cell_type"] != "code":
        return set()
    src = "".join(cell["source"])
    return {float(m.group(0).replace("_", "")) for m in re.finditer(r"(?<![\w.])\d[\d_]*(?:\.\d+)?(?![\w])", src)}


def scan_notebook(nb: dict, chapter: str) -> Tuple[List[Number], set]:
    """(every number of the chapter's prose that neither its outputs print nor the code next to
    it spells out, the numbers its outputs print)."""
    cells, printed, found = nb["cells"], printed_numbers(nb), []
    for i, c in enumerate(cells):
        if c["cell_type"] != "markdown":
            continue
        nearby = code_literals(cells[i - 1] if i else None) | code_literals(cells[i + 1] if i + 1 < len(cells) else None)
        for n in numbers_in("".join(c["source"]), chapter, i):
            if float(n.plain.lstrip("-")) not in nearby:
                found.append(n)
    return found, printed


# ---- declarations ---------------------------------------------------------------------------


class DeclarationError(ValueError):
    """A declaration that cannot be checked: its fields or its source are wrong."""


@dataclass(frozen=True)
class Declaration:
    chapter: str
    text: str
    near: str
    source: str  # "code" | "expr" | "json" | "test" | "definition"
    ref: str
    scale: float = 1.0

    def covers(self, n: Number) -> bool:
        """Whether `n` is this number, inside an occurrence of `near` in its cell's markdown."""
        if n.chapter != self.chapter or n.text != self.text:
            return False
        return any(m.start() <= n.start < m.start() + len(self.near) for m in re.finditer(re.escape(self.near), n.markdown))


SOURCES = ("code", "expr", "json", "test", "definition")


def load_declarations(path: Path = DECLARATIONS) -> List[Declaration]:
    data = tomllib.loads(path.read_text()) if path.exists() else {}
    out = []
    for i, entry in enumerate(data.get("number", [])):
        kinds = [k for k in SOURCES if k in entry]
        unknown = set(entry) - set(SOURCES) - {"chapter", "text", "near", "scale"}
        if len(kinds) != 1 or unknown or not {"chapter", "text", "near"} <= set(entry):
            raise DeclarationError(f"{path.name}: entry {i} ({entry}) needs chapter, text, near and exactly one of "
                                   f"{', '.join(SOURCES)} (and optionally scale); fix it")
        if entry["text"] not in entry["near"]:
            raise DeclarationError(f"{path.name}: entry {i}: near {entry['near']!r} must contain text {entry['text']!r}")
        out.append(Declaration(str(entry["chapter"]), entry["text"], entry["near"], kinds[0], entry[kinds[0]],
                               float(entry.get("scale", 1.0))))
    return out


def _resolve_json(ref: str):
    file, _, keys = ref.partition(":")
    value = json.loads((REPO / file).read_text())
    for key in filter(None, keys.split(".")):
        value = value[int(key)] if isinstance(value, list) else value[key]
    return value


def source_value(d: Declaration):
    """The value `d`'s source gives now (None for a definition)."""
    import importlib

    if d.source == "code":
        module, _, name = d.ref.partition(":")
        obj = importlib.import_module(module)
        for part in name.split("."):
            obj = getattr(obj, part)
        return obj
    if d.source == "expr":
        if str(REPO / "chapters") not in sys.path:
            sys.path.insert(0, str(REPO / "chapters"))
        return eval(d.ref, {"importlib": importlib, "minisgl": importlib.import_module("minisgl")})  # noqa: S307
    if d.source == "json":
        return _resolve_json(d.ref)
    return None


def check_declaration(d: Declaration) -> Optional[str]:
    """Why `d` no longer holds, or None when its source gives the number as written."""
    if d.source == "definition":
        return None if d.ref.strip() else f"{d.text!r} ({d.near!r}): a definition needs its one-line reason"
    if d.source == "test":
        file, _, name = d.ref.partition("::")
        path = REPO / file
        if not path.exists():
            return f"{d.text!r} ({d.near!r}): {file} does not exist"
        src = path.read_text()
        body = re.search(rf"^def {re.escape(name)}\(.*?(?=^\S|\Z)", src, re.S | re.M)
        if body is None:
            return f"{d.text!r} ({d.near!r}): {file} has no test {name}"
        if not re.search(rf"(?<![\w.]){re.escape(d.text.replace(',', '_'))}(?![\w]|\.\d)|(?<![\w.]){re.escape(d.text.replace(',', ''))}(?![\w]|\.\d)", body.group(0)):
            return f"{d.text!r} ({d.near!r}): {d.ref} does not check {d.text}"
        return None
    try:
        value = source_value(d)
    except Exception as e:  # a source that no longer resolves is a finding, not a crash
        return f"{d.text!r} ({d.near!r}): {d.source} {d.ref!r} fails: {type(e).__name__}: {e}"
    try:
        value = float(value) * d.scale
    except (TypeError, ValueError):
        return f"{d.text!r} ({d.near!r}): {d.source} {d.ref!r} gives {value!r}, not a number"
    decimals = len(d.text.partition(".")[2])
    written = float(d.text.replace(",", ""))
    if round(value, decimals) != written:
        return f"{d.text!r} ({d.near!r}): {d.source} {d.ref!r} gives {value}, which is {round(value, decimals)} as written"
    return None


# ---- the check --------------------------------------------------------------------------------


def findings(files: Iterable[Path] = (), declarations: Optional[Sequence[Declaration]] = None) -> List[str]:
    """Every number of the chapters' prose that is neither printed nor declared, and every
    declaration that covers no number of the prose or whose source disagrees."""
    files = list(files) or chapter_files()
    declarations = load_declarations() if declarations is None else declarations
    out, used = [], set()
    for path in files:
        chapter = path.name[:2]
        nb = json.loads(path.read_text())
        found, printed = scan_notebook(nb, chapter)
        for n in found:
            covering = [d for d in declarations if d.covers(n)]
            used.update(covering)
            if n.plain.lstrip("-") not in printed and not covering:
                out.append(f"{path.name} cell {n.cell}: {n.text!r} is neither printed nor declared: {n.context[:160]}")
    scanned = {p.name[:2] for p in files}
    for d in declarations:
        if d.chapter in scanned and d not in used:
            out.append(f"declaration for chapter {d.chapter}, {d.text!r} near {d.near!r}: no such number in its prose any more")
        else:
            problem = check_declaration(d)
            if problem:
                out.append(f"chapter {d.chapter}: {problem}")
    return out


def main(argv: Sequence[str]) -> int:
    files = [p for p in chapter_files() if not argv or p.name[:2] in argv]
    problems = findings(files)
    print("\n".join(problems) or "every number in the prose is printed or declared")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
