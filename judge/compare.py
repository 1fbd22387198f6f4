"""Compare a run's observations with the reference's: the first difference, in the case's terms."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from .api import tolerance


@dataclass
class Difference:
    where: str  # the observation's label
    got: str
    expected: str
    detail: str = ""  # the differing field by name: "remain_len: got 2, expected 3"


def _short(value: Any, limit: int = 160) -> str:
    text = repr(value) if not isinstance(value, str) else value
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _first_diff(got: Any, exp: Any, path: str = "") -> Optional[Tuple[str, str]]:
    """Where inside two plain values they first differ (`[3]`, `.row`) and how, or None if equal."""
    if isinstance(exp, list) and isinstance(got, list):
        for i, (g, e) in enumerate(zip(got, exp)):
            d = _first_diff(g, e, f"{path}[{i}]")
            if d is not None:
                return d
        if len(got) != len(exp):
            return path, f"has length {len(got)}, expected {len(exp)}"
        return None
    if isinstance(exp, dict) and isinstance(got, dict):
        for k in exp:
            if k not in got:
                return f"{path}.{k}", "is missing"
            d = _first_diff(got[k], exp[k], f"{path}.{k}")
            if d is not None:
                return d
        extra = [k for k in got if k not in exp]
        return (f"{path}.{extra[0]}", "is not expected") if extra else None
    if type(got) is bool or type(exp) is bool:
        same = type(got) is type(exp) and got == exp
    else:
        same = got == exp
    return None if same else (path, f"got {_short(got, 60)}, expected {_short(exp, 60)}")


_NAME = re.compile(r"^[A-Za-z_][\w.]*(\(\))?$")


def _field_names(label: str, n: int) -> Optional[List[str]]:
    """The names a label gives the items of a recorded tuple: 'step 2: (cached_len, device_len)'
    names two. None when the label does not list exactly `n` names."""
    tail = label.rsplit(": ", 1)[-1].strip()
    if tail.endswith(")") and "(" in tail:  # 'lengths (cached_len, device_len)'
        tail = tail[tail.rindex("(") + 1: -1]
    names = [t.strip() for t in tail.split(",")]
    return names if len(names) == n and all(_NAME.match(t) for t in names) else None


def _describe(label: str, value: Any, path: str, how: str) -> str:
    """'remain_len: got 2, expected 3': the field by its name where the label names it."""
    m = re.match(r"^\[(\d+)\]", path)
    if m and isinstance(value, list):
        names = _field_names(label, len(value))
        if names is not None:
            return f"{names[int(m.group(1))]}{path[m.end():]}: {how}"
    return f"{label}{path}: {how}"


def _count(shape: List[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _close(got: Dict[str, Any], exp: Dict[str, Any]) -> Optional[str]:
    if got.get("kind") != "close" or got["shape"] != exp["shape"]:
        return f"shape {got.get('shape')} instead of {exp['shape']}"
    # the shape and the number of values first: zipping lists of unequal length would skip the rest
    if len(got["value"]) != len(exp["value"]) or len(got["value"]) != _count(got["shape"]):
        return f"{len(got['value'])} values for shape {got['shape']}, expected {len(exp['value'])}"
    atol, rtol = tolerance(exp["dtype"])
    worst, worst_i = 0.0, -1
    for i, (g, e) in enumerate(zip(got["value"], exp["value"])):
        if math.isnan(g) != math.isnan(e):
            return f"element {i}: got {g}, expected {e}"
        excess = abs(g - e) - (atol + rtol * abs(e))
        if excess > worst:
            worst, worst_i = excess, i
    if worst_i >= 0:
        g, e = got["value"][worst_i], exp["value"][worst_i]
        return f"element {worst_i} (flat index): got {g:.6g}, expected {e:.6g} (tolerance for {exp['dtype']}: atol {atol}, rtol {rtol})"
    return None


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def well_formed(obs: Any) -> bool:
    """Observations as `judge.api.Obs` records them. What a grading process sends is checked
    before it is compared, since the learner's code runs in that process."""
    if not isinstance(obs, list):
        return False
    for o in obs:
        if not isinstance(o, dict) or not isinstance(o.get("label"), str) or o.get("kind") not in ("eq", "close"):
            return False
        if o["kind"] == "close" and not (
            isinstance(o.get("dtype"), str) and isinstance(o.get("shape"), list) and all(isinstance(n, int) for n in o["shape"])
            and isinstance(o.get("value"), list) and all(_number(v) for v in o["value"])
            and all(n >= 0 for n in o["shape"]) and len(o["value"]) == _count(o["shape"])
        ):
            return False
    return True


def first_difference(got: List[Dict[str, Any]], expected: List[Dict[str, Any]]) -> Optional[Difference]:
    for i, exp in enumerate(expected):
        if i >= len(got):
            return Difference(exp["label"], "(nothing: the run stopped earlier)", _short(exp.get("value")) if exp["kind"] == "eq" else "a tensor")
        g = got[i]
        if g["label"] != exp["label"]:
            return Difference(exp["label"], f"{g['label']} = {_short(g.get('value'))}", _short(exp.get("value")),
                              "the run took a different path from here on")
        if exp["kind"] == "close":
            d = _close(g, exp)
            if d is not None:
                return Difference(exp["label"], "values outside the tolerance", "", f"{exp['label']}: {d}")
            continue
        d = _first_diff(g.get("value"), exp.get("value"))
        if d is not None:
            return Difference(exp["label"], _short(g.get("value")), _short(exp.get("value")), _describe(exp["label"], exp.get("value"), *d))
    if len(got) > len(expected):
        extra = got[len(expected)]
        return Difference(extra["label"], _short(extra.get("value")), "(nothing: the reference stopped here)")
    return None
