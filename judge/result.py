"""What a grading returns: one verdict per case and a total, readable in a terminal or a notebook."""

from __future__ import annotations

import html
import os
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import List, Optional


class Status(str, Enum):
    """A case's verdict. A run that ended early reports ERROR, TIMEOUT, OOM or REJECTED; a run that
    completed is PASS or FAIL once its observations are compared; NOT_RUN when grading stopped
    before it (after a load error, or once a wrong variant has failed in `check`)."""

    PASS = "pass"
    FAIL = "fail"
    ERROR = "error"
    TIMEOUT = "timeout"
    OOM = "oom"
    REJECTED = "rejected"
    NOT_RUN = "not run"

    def __str__(self) -> str:
        return self.value


VERDICTS = tuple(Status)
TEXT_LIMIT = 4000  # characters of one case's message (learner text): every output format quotes it whole
FIELD_LIMIT = 1000  # characters of `where`, `got` and `expected`


def clip(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, its head and tail kept and the cut said."""
    if len(text) <= limit:
        return text
    keep = max(limit - 60, 2) // 2
    return f"{text[:keep]}\n... ({len(text) - 2 * keep} characters cut) ...\n{text[-keep:]}"
_MARK = {Status.PASS: "PASS", Status.FAIL: "FAIL", Status.ERROR: "ERROR", Status.TIMEOUT: "TIMEOUT", Status.OOM: "OUT OF MEMORY",
         Status.REJECTED: "REJECTED", Status.NOT_RUN: "NOT RUN"}
_COLOR = {Status.PASS: "#1a7f37", Status.FAIL: "#cf222e", Status.ERROR: "#bc4c00", Status.TIMEOUT: "#8250df", Status.OOM: "#8250df",
          Status.REJECTED: "#cf222e", Status.NOT_RUN: "#57606a"}


@dataclass
class CaseResult:
    name: str  # as the learner reads it ("random queues (seed 1234)")
    kind: str  # "unit" | "e2e"
    status: Status
    message: str = ""  # what went wrong, in the case's terms
    where: str = ""  # the first observation that differs
    got: str = ""
    expected: str = ""
    hint: Optional[int] = None
    seed: Optional[int] = None
    seconds: float = 0.0
    key: str = ""  # the case function's name ("hidden:..." for an instructor's case)
    hidden: bool = False  # an instructor's case from --cases-dir, reported apart from the public ones
    weight: float = 1.0  # the points it is worth

    def __post_init__(self) -> None:
        self.status = Status(self.status)
        # learner text (exception messages, prints, labels) is bounded before any output quotes it
        self.message = clip(str(self.message), TEXT_LIMIT)
        self.name = clip(str(self.name), FIELD_LIMIT)
        self.where, self.got, self.expected = (clip(str(t), FIELD_LIMIT) for t in (self.where, self.got, self.expected))

    @property
    def passed(self) -> bool:
        return self.status is Status.PASS

    @property
    def points(self) -> float:
        return self.weight if self.passed else 0.0

    def lines(self) -> List[str]:
        head = f"[{_MARK[self.status]:>7}] {self.kind:<4} {self.name}  ({self.seconds:.1f} s)"
        out = [head]
        if self.where:
            out.append(f"          at: {self.where}")
        if self.got or self.expected:
            out.append(f"          got:      {self.got}")
            out.append(f"          expected: {self.expected}")
        for line in self.message.splitlines():
            out.append(f"          {line}")
        return out


@dataclass
class GradeResult:
    exercise: str
    file: str
    device: str
    cases: List[CaseResult] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)  # how the grading was done (device, references)
    speed: List[str] = field(default_factory=list)  # on a passing grade: the piece's time against the reference's
    warnings: List[str] = field(default_factory=list)  # files the graded code changed on disk (put back)
    instructor_notes: List[str] = field(default_factory=list)  # about hidden cases: shown in a terminal, kept from learners' outputs

    @property
    def passed(self) -> int:
        return sum(c.passed for c in self.cases)

    @property
    def total(self) -> int:
        return len(self.cases)

    @property
    def ok(self) -> bool:
        return self.total > 0 and self.passed == self.total

    @property
    def score(self) -> float:
        return self.passed / self.total if self.total else 0.0

    @property
    def points(self) -> float:
        """The weighted score: the points of the cases that pass (`max_points` in all)."""
        return round(sum(c.points for c in self.cases), 6)

    @property
    def max_points(self) -> float:
        return round(sum(c.weight for c in self.cases), 6)

    def part(self, hidden: bool) -> List[CaseResult]:
        """The public cases, or an instructor's hidden ones."""
        return [c for c in self.cases if c.hidden == hidden]

    def first_failure(self) -> Optional[CaseResult]:
        return next((c for c in self.cases if not c.passed), None)

    def _hint_number(self) -> int:
        bad = self.first_failure()
        return (bad.hint or 1) if bad is not None else 0

    def _hint_line(self) -> str:
        n = self._hint_number()
        if not n:
            return ""
        return f"hint: `python judge.py hint {self.exercise} {n}` (or exercises/{self.exercise}/hints.md, hint {n})"

    def _hint_html(self) -> str:
        """The hint line for a notebook: the command as code, hints.md as a link the lab opens
        (relative to the kernel's folder, which is the notebook's)."""
        n = self._hint_number()
        if not n:
            return ""
        hints = Path(__file__).resolve().parents[1] / "exercises" / self.exercise / "hints.md"
        href = os.path.relpath(hints, os.getcwd()).replace(os.sep, "/")
        return (f"<div>hint: <code>python judge.py hint {html.escape(self.exercise)} {n}</code> (or "
                f"<a href='{html.escape(href)}'>exercises/{html.escape(self.exercise)}/hints.md</a>, hint {n})</div>")

    def _points_line(self) -> str:
        """Why points can differ from the count of passing cases."""
        return (f"points: {self.points:g}/{self.max_points:g} (what a course grades: a case is worth 1 point unless "
                f"exercise.toml weighs it, and a randomised case's seeds share its points)")

    def __str__(self) -> str:
        lines = [f"{self.exercise}: grading {self.file}"]
        lines += [f"  note: {n}" for n in self.notes + self.instructor_notes]
        lines += [f"  WARNING: {w}" for w in self.warnings]
        hidden = self.part(True)
        for c in self.part(False):
            lines += c.lines()
        if hidden:
            lines.append("hidden cases (the instructor's):")
            for c in hidden:
                lines += c.lines()
        verdict = "all pass" if self.ok else "not yet"
        lines.append(f"score: {self.passed}/{self.total} cases pass ({verdict})")
        if hidden:
            public = self.part(False)
            lines.append(f"  public {sum(c.passed for c in public)}/{len(public)}, hidden {sum(c.passed for c in hidden)}/{len(hidden)}")
        if self.max_points != self.total:
            lines.append(self._points_line())
        lines += [f"speed: {s}" for s in self.speed]
        if not self.ok:
            lines.append(self._hint_line())
        return "\n".join(lines)

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        rows = []
        for c in self.cases:
            detail = ""
            if c.where:
                detail += f"<div><b>at</b> {html.escape(c.where)}</div>"
            if c.got or c.expected:
                detail += f"<div><b>got</b> <code>{html.escape(c.got)}</code></div><div><b>expected</b> <code>{html.escape(c.expected)}</code></div>"
            if c.message:
                detail += f"<pre style='margin:0;white-space:pre-wrap'>{html.escape(c.message)}</pre>"
            rows.append(
                f"<tr><td style='color:{_COLOR[c.status]};font-weight:bold'>{_MARK[c.status]}</td><td>{c.kind}{' (hidden)' if c.hidden else ''}</td>"
                f"<td>{html.escape(c.name)}</td><td style='text-align:left'>{detail}</td><td>{c.seconds:.1f} s</td></tr>"
            )
        color = _COLOR[Status.PASS] if self.ok else _COLOR[Status.FAIL]
        notes = "".join(f"<div style='color:var(--jp-content-font-color2, #57606a)'>{html.escape(n)}</div>" for n in self.notes)
        notes += "".join(f"<div style='color:{_COLOR[Status.FAIL]}'><b>warning:</b> {html.escape(w)}</div>" for w in self.warnings)
        speed = "".join(f"<div><b>speed:</b> {html.escape(s)}</div>" for s in self.speed)
        hint = "" if self.ok else self._hint_html()
        points = f", {self.points:g}/{self.max_points:g} points"
        if self.max_points != self.total:
            points += f"<div style='color:var(--jp-content-font-color2, #57606a)'>{html.escape(self._points_line())}</div>"
        return (
            f"<div><b>{html.escape(self.exercise)}</b>: <span style='color:{color};font-weight:bold'>"
            f"{self.passed}/{self.total} cases pass</span>{points}{notes}"
            f"<table><tr><th>verdict</th><th>kind</th><th>case</th><th>details</th><th>time</th></tr>{''.join(rows)}</table>{speed}{hint}</div>"
        )
