"""The index notebook's two tables: the chapters with their exercises, and your progress.

    import contents
    contents.chapter_table()   # every chapter, what it builds, its judged exercise
    contents.progress()        # which exercises pass, from the judge's record (.judge/results.json)

Exercises are found and read the way the judge reads them (every exercises/<id>/exercise.toml), and results
are read from the same record `python judge.py list` shows, so the three never disagree.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Dict, List

import book

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.append(str(REPO))  # `judge` is at the root; `minisgl` stays whatever the kernel has

from judge import progress as _progress  # noqa: E402
from judge import registry  # noqa: E402
from judge.api import Exercise  # noqa: E402


def exercises() -> List[Exercise]:
    return sorted((registry.declared(i) for i in registry.exercise_ids()), key=lambda e: (e.chapter, e.id))


def _by_chapter() -> Dict[int, List[Exercise]]:
    out: Dict[int, List[Exercise]] = {}
    for ex in exercises():
        out.setdefault(ex.chapter, []).append(ex)
    return out


def _statement(ex: Exercise) -> str:
    return f"[{ex.id}](../exercises/{ex.id}/README.md)"  # plain text: the lab colours links, not code


def chapter_table():
    """The chapters as a Markdown table, linking the notebooks that exist and their exercises."""
    import json

    from IPython.display import Markdown

    found = {int(p.name[:2]): p for p in Path(__file__).resolve().parent.glob("[0-9][0-9]_*.ipynb")}
    by_chapter = _by_chapter()
    lines = ["| | Chapter | What you build | Exercise |", "|---|---|---|---|"]
    for n in range(max(max(found, default=0), max(book.ONE_LINERS)) + 1):
        if n in book.STAGES_OF_THE_BOOK:
            lines.append(f"| | **{book.STAGES_OF_THE_BOOK[n]}** | | |")
        judged = ", ".join(_statement(ex) for ex in by_chapter.get(n, [])) or "—"
        if n in found:
            first = json.loads(found[n].read_text())["cells"][0]["source"]
            title = ("".join(first) if isinstance(first, list) else first).splitlines()[0].lstrip("# ")
            title = title.split("·", 1)[-1].strip()
            lines.append(f"| {n} | [{title}]({found[n].name}) | {book.ONE_LINERS.get(n, '')} | {judged} |")
        elif n in book.ONE_LINERS:
            lines.append(f"| {n} | *(not written yet)* | {book.ONE_LINERS[n]} | {judged} |")
    return Markdown("\n".join(lines))


def progress():
    """Every exercise with your best and latest grading (cell or file) and where your file is."""
    from IPython.display import Markdown

    record = _progress.load()
    all_ex = exercises()
    passing = [ex.id for ex in all_ex if ex.id in record and record[ex.id].best.ok]
    graded = [ex.id for ex in all_ex if ex.id in record]
    if not graded:
        head = (f"**No exercise graded yet** ({len(all_ex)} to go). Start with `req-lengths` in "
                "[chapter 1](01_core.ipynb): run its `%%judge req-lengths` cell.")
    else:
        head = f"**{len(passing)} of {len(all_ex)} exercises pass** ({len(graded)} graded so far)."
    lines = [head, "", "| | Exercise | Ch | Best | Latest | Your file |", "|---|---|---|---|---|---|"]
    for ex in all_ex:
        p = record.get(ex.id)
        mark = "✓" if p and p.best.ok else ("✗" if p else "")  # in every common font, unlike emoji
        best, latest = (str(p.best), str(p.latest)) if p else ("—", "—")
        work = registry.learner_path(ex.id)
        mine = f"[work/{work.name}](../work/{work.name})" if work.exists() else f"`python judge.py start {ex.id}`"
        lines.append(f"| {mark} | {_statement(ex)} | {ex.chapter} | {best} | {latest} | {mine} |")
    return Markdown("\n".join(lines))
