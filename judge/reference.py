"""Recorded reference outputs: `judge/reference/<id>.json`, with the machine they came from.

Only fixed cases are recorded; seeded cases are drawn at grade time and their reference is
computed then. A recording is used only on a machine with the same fingerprint (device kind,
torch, transformers, Python); elsewhere the judge recomputes the reference and says so.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional

from .registry import REFERENCE_DIR


def path_for(exercise_id: str):
    return REFERENCE_DIR / f"{exercise_id}.json"


def load(exercise_id: str) -> Optional[Dict[str, Any]]:
    p = path_for(exercise_id)
    if not p.exists():
        return None
    return json.loads(p.read_text())


def save(exercise_id: str, fingerprint: Dict[str, str], cases: Dict[str, List[Dict[str, Any]]]) -> None:
    REFERENCE_DIR.mkdir(parents=True, exist_ok=True)
    data = {"exercise": exercise_id, "fingerprint": fingerprint, "cases": cases}
    path_for(exercise_id).write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def describe(fp: Dict[str, str]) -> str:
    return f"{fp.get('device')}, torch {fp.get('torch')}, transformers {fp.get('transformers')}, Python {fp.get('python')}"


def usable(recorded: Optional[Dict[str, Any]], current: Dict[str, str], keys: List[str]) -> bool:
    return recorded is not None and recorded.get("fingerprint") == current and all(k in recorded["cases"] for k in keys)
