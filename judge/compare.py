"""Compare a run's observations with the reference's: the first difference, in the case's terms."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from .api import tolerance


@dataclass
class Difference:
    where: str  # the observation's label
    got: str
    expected: str
    detail: str = ""


def _short(value: Any, limit: int = 160) -> str:
    text = repr(value) if not isinstance(value, str) else value
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _first_diff(got: Any, exp: Any, path: str = "") -> Optional[str]:
    """Where inside two plain values they first differ (`[3]`, `.row`), or None if equal."""
    if isinstance(exp, list) and isinstance(got, list):
        for i, (g, e) in enumerate(zip(got, exp)):
            d = _first_diff(g, e, f"{path}[{i}]")
            if d is not None:
                return d
        if len(got) != len(exp):
            return f"{path} has length {len(got)}, expected {len(exp)}"
        return None
    if isinstance(exp, dict) and isinstance(got, dict):
        for k in exp:
            if k not in got:
                return f"{path}.{k} is missing"
            d = _first_diff(got[k], exp[k], f"{path}.{k}")
            if d is not None:
                return d
        extra = [k for k in got if k not in exp]
        return f"{path}.{extra[0]} is not expected" if extra else None
    if type(got) is bool or type(exp) is bool:
        same = type(got) is type(exp) and got == exp
    else:
        same = got == exp
    return None if same else f"{path or 'value'}: got {_short(got, 60)}, expected {_short(exp, 60)}"


def _close(got: Dict[str, Any], exp: Dict[str, Any]) -> Optional[str]:
    if got.get("kind") != "close" or got["shape"] != exp["shape"]:
        return f"shape {got.get('shape')} instead of {exp['shape']}"
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
                return Difference(exp["label"], "values outside the tolerance", "", d)
            continue
        d = _first_diff(g.get("value"), exp.get("value"))
        if d is not None:
            return Difference(exp["label"], _short(g.get("value")), _short(exp.get("value")), d)
    if len(got) > len(expected):
        extra = got[len(expected)]
        return Difference(extra["label"], _short(extra.get("value")), "(nothing: the reference stopped here)")
    return None
