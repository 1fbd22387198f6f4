#!/usr/bin/env python3
"""Grade the workbook's exercises. `python judge.py list`, `start <id>`, `<id>`, `hint <id> [n]`, `check`;
for a course, `grade-all SUBMISSIONS --exercise <id>` (see README, "For instructors")."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from judge.cli import main  # noqa: E402  (the package judge/, not this file)

if __name__ == "__main__":
    sys.exit(main())
