"""Recorded reference outputs: `judge/reference/<id>.json`, with the machine they came from.

Only fixed cases are recorded; seeded cases are drawn at grade time and their reference is
computed then. A recording is used on any machine whose fingerprint agrees on what can change an
observation (`RESULT_FIELDS`: the device, torch's build, transformers); elsewhere the judge
recomputes the reference and its note names each field that differs.
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


def dumps(data: Dict[str, Any]) -> str:
    """The recording as JSON with one observation per line, cases in key order: a re-recording
    that changes one value shows as a one-line diff."""
    one = lambda x: json.dumps(x, sort_keys=True)  # noqa: E731
    lines = ["{", f' "exercise": {one(data["exercise"])},', f' "fingerprint": {one(data["fingerprint"])},', ' "cases": {']
    cases = sorted(data["cases"].items())
    for i, (key, observations) in enumerate(cases):
        lines.append(f"  {one(key)}: [")
        lines += [f"   {one(o)}{',' if j < len(observations) - 1 else ''}" for j, o in enumerate(observations)]
        lines.append("  ]" + ("," if i < len(cases) - 1 else ""))
    lines += [" }", "}"]
    return "\n".join(lines) + "\n"


def save(exercise_id: str, fingerprint: Dict[str, str], cases: Dict[str, List[Dict[str, Any]]]) -> None:
    REFERENCE_DIR.mkdir(parents=True, exist_ok=True)
    data = {"exercise": exercise_id, "fingerprint": fingerprint, "cases": cases}
    path_for(exercise_id).write_text(dumps(data))


# What an observation can depend on: the device runs different kernels, torch's build its numerics,
# transformers the model configs and tokenizers. Python's version changes no observation.
RESULT_FIELDS = ("device", "torch", "transformers")


def describe(fp: Dict[str, str]) -> str:
    return f"{fp.get('device')}, torch {fp.get('torch')}, transformers {fp.get('transformers')}, Python {fp.get('python')}"


def differences(recorded: Dict[str, str], current: Dict[str, str]) -> List[str]:
    """Each field that can change an observation and differs, as "transformers 5.25.0 here,
    5.24.0 recorded" (empty: the recording applies to this machine)."""
    out = []
    for key in RESULT_FIELDS:
        here, there = current.get(key), recorded.get(key)
        if here != there:
            name = "" if key == "device" else f"{key} "
            out.append(f"{name}{here} here, {there} recorded")
    return out


def usable(recorded: Optional[Dict[str, Any]], current: Dict[str, str], keys: List[str]) -> bool:
    return (recorded is not None and not differences(recorded.get("fingerprint", {}), current)
            and all(k in recorded["cases"] for k in keys))
