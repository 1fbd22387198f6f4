"""What grades a file must not be changed by the file: the judge's code, the exercises' cases,
the recorded reference outputs and the engine.

Learner code runs as the same user as the judge, so it *can* write these files. The judge does not
rely on them staying put: the reference outputs and the cases are read before any learner code
runs, every watched file is hashed before a grading and again after it, and whatever changed is
put back from the copy taken before and reported. Before grading, the watched files are also
compared with the versions committed to git (where the repository is a git checkout), and a
recorded reference that differs from its committed version is not used.
"""

from __future__ import annotations

import hashlib
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

from .files import write_whole
from .registry import REPO_ROOT

# the root's *.py too: a new sitecustomize.py there would run in every interpreter the judge starts
_WATCHED = ("judge/**/*.py", "judge/reference/*.json", "*.py", "exercises/*/cases.py", "exercises/*/exercise.toml", "minisgl/**/*.py")


def _watched_files() -> List[Path]:
    out = set()
    for pattern in _WATCHED:
        out.update(p for p in REPO_ROOT.glob(pattern) if p.is_file() and "__pycache__" not in p.parts)
    return sorted(out)


@dataclass
class Change:
    path: str  # relative to the repository
    what: str  # "changed", "deleted" or "added"

    def __str__(self) -> str:
        return f"{self.path} ({self.what})"


class Snapshot:
    """The watched files' bytes, taken before a grading starts."""

    def __init__(self) -> None:
        self.files: Dict[str, bytes] = {}
        self.digests: Dict[str, str] = {}
        for p in _watched_files():
            rel = str(p.relative_to(REPO_ROOT))
            data = p.read_bytes()
            self.files[rel], self.digests[rel] = data, hashlib.sha256(data).hexdigest()

    def retake(self) -> None:
        """Take the files as they are now (after someone else's edit, kept)."""
        self.__init__()

    def changes(self) -> List[Change]:
        now = {str(p.relative_to(REPO_ROOT)): p for p in _watched_files()}
        out = []
        for rel, digest in self.digests.items():
            p = now.get(rel)
            if p is None:
                out.append(Change(rel, "deleted"))
            elif hashlib.sha256(p.read_bytes()).hexdigest() != digest:
                out.append(Change(rel, "changed"))
        out += [Change(rel, "added") for rel in sorted(set(now) - set(self.digests))]
        return out

    def restore(self, changes: List[Change]) -> None:
        """Put every changed or deleted file back as it was, and remove the added ones."""
        for c in changes:
            path = REPO_ROOT / c.path
            if c.what == "added":
                path.unlink(missing_ok=True)
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                write_whole(path, self.files[c.path])  # a link planted in its place is replaced, not written through


def _git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def committed_ids() -> Optional[Dict[str, str]]:
    """{path: blob id} of the watched files in git's index; None outside a git checkout."""
    try:
        proc = subprocess.run(["git", "ls-files", "-s", "--", "judge", "judge.py", "exercises", "minisgl"], cwd=REPO_ROOT,
                              capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    out = {}
    for line in proc.stdout.splitlines():
        meta, _, path = line.partition("\t")
        out[path] = meta.split()[1]
    return out


def differs_from_git(snapshot: Snapshot, committed: Optional[Dict[str, str]]) -> List[str]:
    """Watched files whose content is not the committed one (empty outside a git checkout)."""
    if committed is None:
        return []
    return sorted(rel for rel, data in snapshot.files.items() if rel in committed and _git_blob_id(data) != committed[rel])


def committed_text(rel: str) -> Optional[str]:
    try:
        proc = subprocess.run(["git", "show", f":{rel}"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None
