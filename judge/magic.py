"""`%%judge <id>`: grade the code of a notebook cell as the learner's file for exercise <id>.

In the lab every kernel registers it as it starts (.jupyter/kernel_startup.py), so an exercise
cell works even in a freshly restarted kernel; `book.setup_chapter(n)` registers it too, for a
chapter run elsewhere (nbclient, VS Code); anywhere else `import judge` or `%load_ext judge` does.
"""

from __future__ import annotations

import html
import tempfile
from pathlib import Path

from .result import GradeResult

USAGE = "usage: %%judge <exercise-id> [--seed N]   (the cell's body is your code for the exercise)"
CELL = "this cell"


def _parse(line: str) -> tuple[str, int | None]:
    parts = line.split()
    if not parts or parts[0].startswith("-"):
        raise ValueError(USAGE)
    seed = None
    if "--seed" in parts:
        i = parts.index("--seed")
        if i + 1 >= len(parts) or not parts[i + 1].lstrip("-").isdigit():
            raise ValueError(f"--seed takes a whole number; {USAGE}")
        seed = int(parts[i + 1])
    return parts[0], seed


class NotStarted:
    """What grading an untouched starter shows, in a cell or a terminal: nothing graded, nothing
    recorded, so a run of the starter never replaces the learner's latest result."""

    def __init__(self, exercise_id: str, where: str = CELL, again: str = "run the cell again") -> None:
        self.exercise, self.where, self.again = exercise_id, where, again

    def __str__(self) -> str:
        return (f"{self.exercise}: not started. {self.where[0].upper() + self.where[1:]} still holds the starter "
                f"(every piece raises NotImplementedError), so it was not graded and your progress is unchanged. "
                f"Write the pieces and {self.again}.")

    __repr__ = __str__

    def _repr_html_(self) -> str:
        return (f"<div style='color:var(--jp-content-font-color2, #57606a)'><b>{html.escape(self.exercise)}</b>: "
                f"{html.escape(str(self).split(': ', 1)[1])}</div>")


def judge_cell(line: str, cell: str) -> GradeResult | NotStarted:
    """Grade `cell` as exercise `line`'s file; the result names it "this cell", not a temporary file.
    A cell whose pieces all still raise NotImplementedError (the starter, as Run All finds it) is
    not graded and not recorded: NotStarted says so."""
    from . import progress, registry, submission
    from .grade import grade

    from IPython.core.error import UsageError

    try:
        exercise_id, seed = _parse(line)
        registry.folder(exercise_id)  # an unknown id fails here, with the list of known ones
    except (ValueError, registry.UnknownExerciseError) as exc:
        raise UsageError(str(exc)) from None  # IPython shows the message alone, no traceback
    if submission.untouched(cell, registry.declared(exercise_id).replaces):
        return NotStarted(exercise_id)  # Run All on a chapter reaches this cell: no attempt to record
    print(f"{exercise_id}: grading {CELL} (reference and your code run side by side; this takes a few seconds)")
    with tempfile.TemporaryDirectory(prefix="judge-cell-") as tmp:
        path = Path(tmp) / f"{exercise_id.replace('-', '_')}_cell.py"
        path.write_text(cell)
        result = grade(exercise_id, path, seed=seed, save=False)
        result.file = CELL
        for case in result.cases:  # a message that quotes the path speaks of the cell instead
            case.message = case.message.replace(str(path.resolve()), CELL).replace(str(path), CELL)
    progress.record(result)
    return result


def register(ipython) -> None:
    ipython.register_magic_function(judge_cell, magic_kind="cell", magic_name="judge")


def load_ipython_extension(ipython) -> None:  # `%load_ext judge`
    register(ipython)


def register_in_ipython() -> None:
    """Register `%%judge` in the IPython this runs in (importing `judge` does; so does
    `book.setup_chapter`); outside IPython, nothing."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    ip = get_ipython()
    if ip is not None:
        register(ip)
