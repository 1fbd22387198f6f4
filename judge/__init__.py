"""The workbook's judge: grades an exercise by plugging the learner's piece into the real engine.

    from judge import grade
    grade("prefill-adder", "work/prefill-adder.py")   # a GradeResult (shows as a table in Jupyter)

In IPython, importing this package also registers the cell magic `%%judge <id>`.
"""

from __future__ import annotations

from .grade import grade
from .magic import load_ipython_extension, register_in_ipython
from .result import CaseResult, GradeResult, Status

__all__ = ["grade", "GradeResult", "CaseResult", "Status", "load_ipython_extension"]

register_in_ipython()
