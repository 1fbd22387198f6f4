"""Put the judge's Gradescope results in place: `publish.py OUTPUTS RESULTS STATUS`.

`run_autograder` has the judge write into OUTPUTS, a folder the graded code cannot open; this
copies the judge's results.json (and junit.xml) to RESULTS, replacing whatever is there. Where the
judge wrote no readable results.json (it died: STATUS is its exit status), RESULTS gets an error
result, a zero that says so. Standard library only: it runs whatever state the workbook is in.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, Optional


def _judges(outputs: Path) -> Optional[Dict[str, Any]]:
    """The judge's results.json, if it is one: an object with a numeric score and a list of tests."""
    try:
        data = json.loads((outputs / "results.json").read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(data, dict) and isinstance(data.get("score"), (int, float)) and isinstance(data.get("tests"), list)
    return data if ok else None


def _error(status: str) -> Dict[str, Any]:
    return {"score": 0.0, "output": f"the judge could not grade this submission (it ended with status {status}); "
                                    "see the autograder log, or ask the instructor to regrade",
            "output_format": "text", "visibility": "visible", "stdout_visibility": "hidden", "tests": []}


def _replace(target: Path, text: str) -> None:
    """Write `target` through a new file renamed over it: a link planted there is replaced, not followed."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    os.fchmod(fd, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, target)


def main(outputs: Path, results: Path, status: str) -> int:
    results.mkdir(parents=True, exist_ok=True)
    data = _judges(outputs)
    _replace(results / "results.json", json.dumps(data if data is not None else _error(status), indent=1) + "\n")
    junit = outputs / "junit.xml"
    if data is not None and junit.is_file():
        _replace(results / "junit.xml", junit.read_text())
    else:
        (results / "junit.xml").unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: publish.py OUTPUTS RESULTS STATUS")
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]))
