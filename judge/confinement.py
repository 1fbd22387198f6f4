"""What the judge can keep the graded code from doing on this machine, and what it cannot.

Each protection comes from a kernel feature that a machine may lack (an old kernel, a container
whose seccomp profile refuses the calls): Landlock (`judge.sandbox`), a seccomp filter
(`judge.seccomp`), namespaces (`judge.namespaces`). The judge asks each worker for what this
machine has (`wanted`), and the worker refuses to run the learner's code if any of it fails.

Grading a class (`grade-all`, an autograder's `grade --gradescope`) without one of them is
refused unless the instructor says to go on (`--allow-weaker-sandbox`): the gap is then printed
with the grades, never silent. `python judge.py sandbox` prints this machine's survey.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List

from . import cgroups, namespaces, sandbox, seccomp

FLAG = "--allow-weaker-sandbox"


@dataclass(frozen=True)
class Protection:
    name: str
    keeps: str  # what the graded code cannot do with it
    have: bool
    by: str  # what gives it here, or what it needs
    without: str  # what the judge still does where it is missing


class WeakSandboxError(RuntimeError):
    """A class is to be graded on a machine that lacks protections the judge counts on."""


def wanted() -> Dict[str, bool]:
    """What each worker must set up (all of what this machine has): the job's "confine"."""
    return {"landlock": sandbox.available(), "seccomp": seccomp.available(), "namespaces": namespaces.available()}


def survey() -> List[Protection]:
    abi = sandbox.abi_version() if sandbox.available() else 0
    ns = namespaces.available()
    ns_why = "" if ns else f" ({namespaces.why_not() or 'not used'})"
    return [
        Protection("files", "read the recorded references, git's objects, the judge's state and hidden cases; write the repository",
                   abi >= 1, f"Landlock ABI {abi}" if abi else "needs Landlock (Linux 5.13+, allowed by the container)",
                   "files the graded code changed are put back after the grading, but what it read cannot be unread"),
        Protection("metadata", "change files' permissions, owners, times or extended attributes", seccomp.available(),
                   "a seccomp filter" if seccomp.available() else "needs seccomp filters on x86-64 or arm64 Linux",
                   "a chmod of the repository's files stays until someone notices"),
        Protection("network", "send or receive anything over the network", ns,
                   "a network namespace" if ns else "needs a network namespace" + ns_why,
                   "Landlock ABI 4 (Linux 6.7+) still refuses TCP, but UDP goes out" if abi >= 4
                   else "the graded code may reach this machine's services and the internet"),
        Protection("processes", "see or signal the judge, the fork server, the reference's worker or other learners' workers",
                   ns or abi >= 6,
                   "a pid namespace" if ns else f"Landlock ABI {abi} (signals only: /proc still lists them)" if abi >= 6
                   else "needs a pid namespace or Landlock ABI 6 (Linux 6.12+)" + ns_why,
                   "a killed or stopped judge process is detected and replaced, and the grading ends in an error instead of a verdict"),
    ]


def missing() -> List[Protection]:
    return [p for p in survey() if not p.have]


def describe() -> str:
    lines = ["the graded code runs confined here; it cannot:"]
    for p in survey():
        lines.append(f"  [{'x' if p.have else ' '}] {p.name:<9} {p.keeps}: " + (p.by if p.have else f"MISSING: {p.by}; without it, {p.without}"))
    lines.append("everything a grading starts ends with it, and with the judge: " + (
        "a pid namespace per worker" if namespaces.available() else "subreapers and parent-death signals (a process that detaches and "
        "whose supervisors were all killed can escape)"))
    lines.append("fork bombs: " + (f"a cgroup per worker under {cgroups.root()} caps it at {cgroups.MAX_TASKS} tasks, and every "
                                   "refused fork is seen" if cgroups.available() else
                                   "no writable cgroup with the pids controller: processes are counted by looking, so a fast "
                                   "bomb may get further in one run than in another"))
    return "\n".join(lines)


def require(allow_weaker: bool) -> List[str]:
    """Before grading a class: raise WeakSandboxError if a protection is missing and the
    instructor did not allow it; else the warnings to print with the grades."""
    gaps = missing()
    if not gaps:
        return []
    names = ", ".join(p.name for p in gaps)
    if not allow_weaker:
        raise WeakSandboxError(f"this machine cannot give the graded code the full sandbox (missing: {names}), so learners' code could "
                               f"do what the judge is there to stop:\n{describe()}\nGrade on a machine that has them, or pass {FLAG} "
                               f"to grade anyway (the gap is then noted with every grade).")
    return [f"graded with a weaker sandbox ({FLAG}): the graded code could {p.keeps} ({p.by})" for p in gaps]
