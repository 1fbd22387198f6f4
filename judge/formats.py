"""A grading in the formats course infrastructure reads: Gradescope's autograder `results.json`
and JUnit XML (GitHub Classroom, GitLab, most CI systems).

    gradescope(result)            # the dict for /autograder/results/results.json
    junit({"alice": result})      # one <testsuite> per learner, one <testcase> per case

A case's points are its weight (exercise.toml's `weights`, default 1; a seeded case's points are
shared by its seeds). Hidden cases (an instructor's `--cases-dir`) are reported apart: on
Gradescope with the visibility `hidden_visibility` (students see them once grades are published).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Dict, List, Optional, Union

from .result import CaseResult, GradeResult, Status

# Gradescope's documented fields of results.json and of one test in it, and the visibilities.
GRADESCOPE_TOP = ("score", "execution_time", "output", "output_format", "test_output_format", "test_name_format", "visibility",
                  "stdout_visibility", "extra_data", "tests", "leaderboard")
GRADESCOPE_TEST = ("score", "max_score", "status", "name", "name_format", "number", "output", "output_format", "tags", "visibility",
                   "extra_data")
VISIBILITIES = ("hidden", "after_due_date", "after_published", "visible")


def _case_output(c: CaseResult) -> str:
    return "\n".join(line.strip() for line in c.lines()[1:])


def _test(c: CaseResult, number: int, hidden_visibility: str) -> dict:
    return {
        "name": f"{'[hidden] ' if c.hidden else ''}{c.kind}: {c.name}",
        "number": str(number),
        "score": round(c.points, 6),
        "max_score": round(c.weight, 6),
        "status": "passed" if c.passed else "failed",
        "output": f"{str(c.status).upper()}" + (f"\n{_case_output(c)}" if _case_output(c) else ""),
        "tags": [c.kind, "hidden" if c.hidden else "public", str(c.status)],
        "visibility": hidden_visibility if c.hidden else "visible",
    }


def gradescope(result: Optional[GradeResult], *, reason: str = "", max_points: float = 0.0,
               hidden_visibility: str = "after_published") -> dict:
    """Gradescope's results.json for one grading; with `result` None (no submission to grade),
    a zero score whose output says `reason`."""
    if hidden_visibility not in VISIBILITIES:
        raise ValueError(f"hidden_visibility is one of {', '.join(VISIBILITIES)}, got {hidden_visibility!r}")
    if result is None:
        return {"score": 0.0, "output": f"not graded: {reason}", "output_format": "text", "visibility": "visible",
                "stdout_visibility": "hidden", "extra_data": {"max_points": max_points}, "tests": []}
    public, hidden = result.part(False), result.part(True)
    # the top-level output is always visible: the hidden cases' count and folder only where they are
    reveal = hidden_visibility == "visible"
    summary = [f"{result.exercise}: {sum(c.passed for c in public)}/{len(public)} public cases pass"]
    if hidden and reveal:
        summary.append(f"hidden cases: {sum(c.passed for c in hidden)}/{len(hidden)} pass")
    summary += [f"note: {n}" for n in result.notes + (result.instructor_notes if reveal else [])]
    summary += [f"WARNING: {w}" for w in result.warnings]
    tests = [_test(c, i, hidden_visibility) for i, c in enumerate(public + hidden, 1)]
    return {
        "score": result.points,
        "execution_time": round(sum(c.seconds for c in result.cases), 3),
        "output": "\n".join(summary),
        "output_format": "text",
        "test_output_format": "text",
        "visibility": "visible",
        "stdout_visibility": "hidden",
        "extra_data": {"exercise": result.exercise, "max_points": result.max_points, "device": result.device},
        "tests": tests,
    }


def _suite(parent: ET.Element, name: str, result: Union[GradeResult, str]) -> None:
    suite = ET.SubElement(parent, "testsuite", name=name)
    if isinstance(result, str):  # nothing graded: one error says why
        case = ET.SubElement(suite, "testcase", classname=name, name="submission", time="0")
        ET.SubElement(case, "error", message=result, type="missing").text = result
        suite.attrib.update(tests="1", failures="0", errors="1", skipped="0", time="0")
        return
    props = ET.SubElement(suite, "properties")  # first, as the schema has it
    for k, v in (("points", f"{result.points:g}"), ("max_points", f"{result.max_points:g}"), ("device", result.device)):
        ET.SubElement(props, "property", name=k, value=v)
    failures = errors = 0
    for c in result.cases:
        case = ET.SubElement(suite, "testcase", classname=f"{result.exercise}.{'hidden' if c.hidden else 'public'}",
                             name=f"{c.kind}: {c.name}", time=f"{c.seconds:.3f}")
        if c.passed:
            continue
        text = _case_output(c)
        first = (text.splitlines() or [str(c.status)])[0]
        if c.status in (Status.FAIL, Status.NOT_RUN):
            failures += 1
            ET.SubElement(case, "failure", message=first, type=str(c.status)).text = text
        else:
            errors += 1
            ET.SubElement(case, "error", message=first, type=str(c.status)).text = text
    suite.attrib.update(tests=str(result.total), failures=str(failures), errors=str(errors), skipped="0",
                        time=f"{sum(c.seconds for c in result.cases):.3f}")


def junit(results: Dict[str, Union[GradeResult, str]], name: str = "judge") -> str:
    """JUnit XML: one <testsuite> per entry (a learner, or the one file graded), one <testcase>
    per case; a str value is a submission that could not be graded, and says why."""
    root = ET.Element("testsuites", name=name)
    for suite_name, result in results.items():
        _suite(root, suite_name, result)
    totals = {k: sum(int(s.get(k, "0")) for s in root) for k in ("tests", "failures", "errors")}
    root.attrib.update({k: str(v) for k, v in totals.items()})
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def gradescope_fields_ok(data: dict) -> List[str]:
    """What in `data` is not Gradescope's documented results.json (empty: all of it is)."""
    bad = [f"unknown field {k!r}" for k in data if k not in GRADESCOPE_TOP]
    for i, t in enumerate(data.get("tests", [])):
        bad += [f"test {i}: unknown field {k!r}" for k in t if k not in GRADESCOPE_TEST]
        if t.get("visibility", "visible") not in VISIBILITIES:
            bad.append(f"test {i}: visibility {t['visibility']!r}")
    return bad
