"""A class's grades as an instructor reads them: a row per learner and case (grades.csv,
grades.json), a row per learner (totals.csv), JUnit XML and Gradescope's results per learner.

    batch.write(Path("grades-prefill-adder"))

A learner on the roster with no folder, or a folder with no answer, is a row saying why; a
learner not graded yet (an interrupted run) is a row saying so, for `grade-all --resume`.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Union

from . import formats, submission
from .files import write_whole
from .result import CaseResult, GradeResult

COLUMNS = ("learner", "exercise", "part", "case", "kind", "verdict", "score", "max_score", "seconds", "submission", "reason")
TOTALS = ("learner", "verdict", "points", "max_points", "public", "hidden", "submission", "reason", "warnings")
NOT_GRADED = "not graded"  # the run stopped before this learner (see `grade-all --resume`)


@dataclass
class Row:
    learner: str
    exercise: str
    part: str  # "public", "hidden", or "" for a submission that was not graded
    case: str
    kind: str
    verdict: str
    score: float
    max_score: float
    seconds: float
    submission: str
    reason: str = ""


@dataclass
class LearnerGrade:
    learner: str
    found: submission.Submission
    result: Optional[GradeResult] = None
    seconds: float = 0.0  # wall time of this learner's grading
    pending: bool = False  # has an answer, but was not graded (the run was stopped first)

    @property
    def verdict(self) -> str:
        if self.result is not None:
            return "graded"
        if self.pending:
            return NOT_GRADED
        return "missing" if self.found.path is None else "unreadable"

    @property
    def reason(self) -> str:
        return "the run stopped before this learner: `grade-all --resume` grades the rest" if self.pending else self.found.reason

    @property
    def warnings(self) -> List[str]:
        return list(self.found.warnings) + (list(self.result.warnings) if self.result is not None else [])

    def rows(self, exercise: str, root: Path, max_points: float) -> List[Row]:
        where = display(self.found.path, root)
        if self.result is None:
            return [Row(self.learner, exercise, "", "", "", self.verdict, 0.0, max_points, 0.0, where, self.reason)]
        out = []
        for c in self.result.cases:
            reason = "" if c.passed else (c.message.splitlines()[0] if c.message else c.where)
            out.append(Row(self.learner, exercise, "hidden" if c.hidden else "public", c.name, c.kind, str(c.status),
                           round(c.points, 6), round(c.weight, 6), round(c.seconds, 3), where, reason[:300]))
        return out

    def to_json(self) -> dict:
        found = {"path": str(self.found.path) if self.found.path else None, "reason": self.found.reason, "warnings": self.found.warnings}
        return {"learner": self.learner, "found": found, "result": asdict(self.result) if self.result else None, "seconds": self.seconds}

    @classmethod
    def from_json(cls, data: dict) -> "LearnerGrade":
        f = data["found"]
        found = submission.Submission(data["learner"], Path(f["path"]) if f["path"] else None, None, f["reason"], list(f["warnings"]))
        r = data["result"]
        result = None
        if r is not None:
            result = GradeResult(**dict(r, cases=[CaseResult(**c) for c in r["cases"]]))
        return cls(data["learner"], found, result, float(data["seconds"]))


def read_roster(path: Union[str, Path]) -> List[str]:
    """Learner names, one a line (or the first column of a CSV); blank lines, `#` comments and a
    `learner` header are skipped."""
    names = []
    for row in csv.reader(io.StringIO(Path(path).read_text(encoding="utf-8"))):
        name = row[0].strip() if row else ""
        if name and not name.startswith("#") and name.lower() != "learner":
            names.append(name)
    return list(dict.fromkeys(names))


@dataclass
class Batch:
    exercise: str
    seed: int
    root: Path
    device: str
    notes: List[str]
    learners: List[LearnerGrade] = field(default_factory=list)
    max_points: float = 0.0
    seconds: float = 0.0
    interrupted: bool = False  # stopped (Ctrl-C) before every learner was graded

    def rows(self) -> List[Row]:
        return [r for g in self.learners for r in g.rows(self.exercise, self.root, self.max_points)]

    def summary(self) -> List[Dict[str, object]]:
        out = []
        for g in self.learners:
            r = g.result
            entry: Dict[str, object] = {"learner": g.learner, "verdict": g.verdict, "submission": display(g.found.path, self.root),
                                        "reason": g.reason, "points": r.points if r else 0.0, "max_points": self.max_points,
                                        "seconds": round(g.seconds, 3)}
            if r is not None:
                for part, hidden in (("public", False), ("hidden", True)):
                    cases = r.part(hidden)
                    if cases:
                        entry[part] = f"{sum(c.passed for c in cases)}/{len(cases)}"
            entry["warnings"] = g.warnings
            out.append(entry)
        return out

    def write(self, out: Path, hidden_visibility: str = "after_published") -> Dict[str, Path]:
        """grades.csv and grades.json (the table), totals.csv (a row per learner), junit.xml, and
        gradescope/<learner>/results.json. Each file is written whole, through a new file renamed
        into place."""
        out.mkdir(parents=True, exist_ok=True)
        rows = self.rows()
        paths = {"csv": out / "grades.csv", "totals": out / "totals.csv", "json": out / "grades.json", "junit": out / "junit.xml"}
        write_whole(paths["csv"], _csv(COLUMNS, [asdict(r) for r in rows]))
        summary = self.summary()
        totals = [{k: ("; ".join(s[k]) if k == "warnings" else s.get(k, "")) for k in TOTALS} for s in summary]
        write_whole(paths["totals"], _csv(TOTALS, totals))
        write_whole(paths["json"], json.dumps({
            "exercise": self.exercise, "seed": self.seed, "device": self.device, "notes": self.notes, "interrupted": self.interrupted,
            "max_points": self.max_points, "learners": summary, "rows": [asdict(r) for r in rows],
        }, indent=1) + "\n")
        suites: Dict[str, Union[GradeResult, str]] = {g.learner: g.result if g.result is not None else f"{g.verdict}: {g.reason}"
                                                      for g in self.learners}
        write_whole(paths["junit"], formats.junit(suites, name=f"judge: {self.exercise}"))
        for g in self.learners:
            target = out / "gradescope" / g.learner / "results.json"
            target.parent.mkdir(parents=True, exist_ok=True)
            data = formats.gradescope(g.result, reason=g.reason, max_points=self.max_points, hidden_visibility=hidden_visibility)
            write_whole(target, json.dumps(data, indent=1) + "\n")
        return paths


def _csv(columns, rows: List[dict]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def display(path: Optional[Path], root: Path) -> str:
    if path is None:
        return ""
    try:
        return str(path.resolve().relative_to(root.resolve()))
    except ValueError:
        return str(path)
