"""What a grading returns: one verdict per case and a total, readable in a terminal or a notebook."""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import List, Optional

VERDICTS = ("pass", "fail", "error", "timeout", "oom", "rejected")
_MARK = {"pass": "PASS", "fail": "FAIL", "error": "ERROR", "timeout": "TIMEOUT", "oom": "OUT OF MEMORY", "rejected": "REJECTED"}
_COLOR = {"pass": "#1a7f37", "fail": "#cf222e", "error": "#bc4c00", "timeout": "#8250df", "oom": "#8250df", "rejected": "#cf222e"}


@dataclass
class CaseResult:
    name: str  # as the learner reads it ("random queues (seed 1234)")
    kind: str  # "unit" | "e2e"
    status: str  # one of VERDICTS
    message: str = ""  # what went wrong, in the case's terms
    where: str = ""  # the first observation that differs
    got: str = ""
    expected: str = ""
    hint: Optional[int] = None
    seed: Optional[int] = None
    seconds: float = 0.0

    def __post_init__(self) -> None:
        assert self.status in VERDICTS, self.status

    @property
    def passed(self) -> bool:
        return self.status == "pass"

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
    hint_command: str = ""

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

    def first_failure(self) -> Optional[CaseResult]:
        return next((c for c in self.cases if not c.passed), None)

    def _hint_line(self) -> str:
        bad = self.first_failure()
        if bad is None:
            return ""
        n = bad.hint or 1
        return f"hint: `python judge.py hint {self.exercise} {n}` (or exercises/{self.exercise}/hints.md, hint {n})"

    def __str__(self) -> str:
        lines = [f"{self.exercise}: grading {self.file}"]
        lines += [f"  note: {n}" for n in self.notes]
        for c in self.cases:
            lines += c.lines()
        verdict = "all cases pass" if self.ok else "not yet"
        lines.append(f"score: {self.passed}/{self.total} ({verdict})")
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
                f"<tr><td style='color:{_COLOR[c.status]};font-weight:bold'>{_MARK[c.status]}</td><td>{c.kind}</td>"
                f"<td>{html.escape(c.name)}</td><td style='text-align:left'>{detail}</td><td>{c.seconds:.1f} s</td></tr>"
            )
        color = _COLOR["pass"] if self.ok else _COLOR["fail"]
        notes = "".join(f"<div style='color:#57606a'>{html.escape(n)}</div>" for n in self.notes)
        hint = "" if self.ok else f"<div>{html.escape(self._hint_line())}</div>"
        return (
            f"<div><b>{html.escape(self.exercise)}</b>: <span style='color:{color};font-weight:bold'>"
            f"{self.passed}/{self.total} cases pass</span>{notes}"
            f"<table><tr><th>verdict</th><th>kind</th><th>case</th><th>details</th><th>time</th></tr>{''.join(rows)}</table>{hint}</div>"
        )
