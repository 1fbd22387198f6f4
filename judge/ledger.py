"""What `grade-all` has graded so far: one file per learner in `<out>/learners/`, written as each
learner finishes (after their processes are gone), so an interrupted or crashed run loses nothing
and `--resume` grades only the rest. `<out>/learners/batch.json` holds the exercise and the seed:
a resumed run, or a regrade of some learners, meets the same cases as the first.

    ledger = Ledger.open(out, "prefill-adder", seed=None, merge=True)
    ledger.seed                 # the recorded one, when there is a record
    ledger.save(grade); ledger.load("ada")
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from .files import write_whole
from .gradebook import LearnerGrade

META = "batch.json"


class LedgerError(ValueError):
    """The recorded gradings cannot be merged with this run's."""


@dataclass
class Ledger:
    folder: Path
    exercise: str
    seed: int

    @classmethod
    def open(cls, out: Path, exercise: str, seed: Optional[int], merge: bool) -> "Ledger":
        """The record in `out`. `merge` (a resumed run, or a regrade of some learners): keep the
        recorded gradings, and their seed; otherwise start a new record."""
        folder = out / "learners"
        meta = folder / META
        recorded = json.loads(meta.read_text()) if merge and meta.is_file() else None
        if recorded is not None:
            if recorded.get("exercise") != exercise:
                raise LedgerError(f"{out} holds gradings of {recorded.get('exercise')!r}, not {exercise!r}: give another --out")
            if seed is not None and seed != recorded["seed"]:
                raise LedgerError(f"the gradings in {out} used seed {recorded['seed']}: leave --seed out (or give that one), "
                                  "or grade everyone again without --resume/--only")
            return cls(folder, exercise, int(recorded["seed"]))
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.glob("*.json"):  # a new record: the last run's gradings go
            old.unlink()
        ledger = cls(folder, exercise, seed if seed is not None else random.SystemRandom().randrange(1, 2**31))
        write_whole(meta, json.dumps({"exercise": exercise, "seed": ledger.seed}) + "\n")
        return ledger

    def _path(self, learner: str) -> Path:
        return self.folder / f"{learner}.learner.json"

    def save(self, grade: LearnerGrade) -> None:
        write_whole(self._path(grade.learner), json.dumps(grade.to_json()) + "\n")

    def load(self, learner: str) -> Optional[LearnerGrade]:
        try:
            return LearnerGrade.from_json(json.loads(self._path(learner).read_text()))
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError) as exc:
            raise LedgerError(f"{self._path(learner)} cannot be read ({type(exc).__name__}: {exc}): remove it to grade "
                              f"{learner} again") from exc
