"""The grading fork server: every worker is started by it, and every process a worker starts
stays below it (see `judge.procs`). On the CPU it imports torch and the engine once (and each
exercise's cases when a worker first needs them) and forks each worker from that state: starting
a fresh interpreter costs seconds, and `check` starts a hundred. With `--exec` (CUDA: a CUDA
context does not survive a fork) each worker is a fresh interpreter.

Protocol: the runner writes one JSON line per job to our stdin ({"exercise", "job", "err",
"pid", "rlimit_as", "namespaces"}). For each, a keeper process forks the worker, writes "KEEPER
WORKER START" (pids and the worker's start time) to `pid`, and waits. When the worker ends, the
keeper kills whatever the worker left behind and writes its exit status as `pid`'s second line
(negative: the signal). With "namespaces", the worker runs in pid, network and mount
namespaces of its own (`judge.namespaces`), below a small first process (`_init`); with
"cgroup", in that capped cgroup (`judge.cgroups`).

Nothing here outlives the judge: when the judge ends (however it ends: SIGKILL too), the kernel
sends the fork server SIGTERM, and it kills everything below it; when the fork server ends, each
keeper does the same; a namespace's first process ends when its keeper does, and the kernel then
kills everything in the namespace (`procs.die_with_parent`). With its input closed, the server takes no more jobs and exits once
its keepers have.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
import time
import traceback
from pathlib import Path

from judge import cgroups, namespaces, procs
from judge.files import write_whole  # the runner never sees half a line


def _preload() -> None:
    import torch  # noqa: F401

    from judge import api, harness, install, privileges, registry, sandbox, seccomp, speed, worker  # noqa: F401

    worker.import_engine()


def _load_cases(exercise_id: str) -> None:
    """Read an exercise's public cases here, before forking, so every worker has them before any
    learner code runs (this process never runs learner code). An instructor's hidden cases are
    read by the workers that run them, and no other: a worker's memory is the learner's to read."""
    from judge import registry

    try:
        registry.load(exercise_id)
    except Exception:  # a broken cases.py is reported by the worker that needs it
        pass


def _run_worker(req: dict, fresh: bool, below_init: bool = False) -> None:
    """In the keeper's child (or, below a namespace's first process, its grandchild): become the worker."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the keeper's handler is not ours
    if req.get("cgroup") and not below_init:  # before anything else is started (the init entered it already)
        cgroups.enter(req["cgroup"])
    os.setsid()  # away from the terminal's signals
    if req.get("rlimit_as"):
        resource.setrlimit(resource.RLIMIT_AS, (req["rlimit_as"], req["rlimit_as"]))
    fd = os.open(req["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    if fresh:
        os.execv(sys.executable, [sys.executable, "-m", "judge.worker", req["job"]])
    code = 0
    try:
        from judge import worker

        code = worker.main(req["job"])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def _init(req: dict, fresh: bool, keeper: procs.Proc, report: int) -> None:
    """The first process (pid 1) of the worker's pid namespace: make its network and mount
    namespaces, fork the worker, reap whatever is orphaned in the namespace, and end with the
    worker, writing its wait status to `report`. The worker is not pid 1 itself: the kernel
    shields a namespace's pid 1 from its own signals, and the worker must stop, crash or be
    killed as anywhere else. When this process ends, the kernel kills all that is left in the
    namespace; it ends when the keeper does."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if not procs.die_with_parent(signal.SIGKILL, keeper.pid, keeper.start):
        os._exit(1)
    if req.get("cgroup"):
        cgroups.enter(req["cgroup"])
    why = namespaces.isolate()
    if why is not None:  # the worker reports it before any of the learner's code runs
        os.environ[namespaces.REFUSED] = why
    worker = os.fork()
    if worker == 0:
        os.close(report)
        _run_worker(req, fresh, below_init=True)
    while True:
        try:
            done, status = os.waitpid(-1, 0)
        except ChildProcessError:
            os._exit(1)
        if done == worker:
            os.write(report, f"{status}\n".encode())
            os._exit(0)


def _worker_below(init: int, wait_s: float = 10.0) -> int:
    """The worker, seen from here: the child of `init` that is pid 2 in its namespace."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and procs.alive(init):
        for pid in procs.children(init):
            if procs.namespace_pid(pid) == 2:
                return pid
        time.sleep(0.001)
    return init  # gone already: its status says how


_CGROUPS: set = set()  # the workers' cgroups below this process: the judge removes them, unless it is gone first


def _end_below(*_: object) -> None:
    """The end of a keeper whose server ended, or of a server whose judge ended: everything below
    it first, then the cgroups that the judge would have removed."""
    # all below us, looked up on every pass: not only what one look saw (a process forked after it escaped)
    procs.kill_tree({os.getpid(): None})
    for folder in _CGROUPS:
        cgroups.remove(Path(folder))
    os._exit(1)


def _keep(req: dict, fresh: bool, server: int) -> None:
    """In the child: fork the worker, report its pid, reap what it orphans, report how it ended."""
    _CGROUPS.clear()
    if req.get("cgroup"):
        _CGROUPS.add(req["cgroup"])
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # waitpid needs children reported again
    signal.signal(signal.SIGTERM, _end_below)
    if not procs.die_with_parent(signal.SIGTERM, server):
        _end_below()
    procs.set_subreaper()  # the worker's orphans come to us
    report = None
    if req.get("namespaces"):
        why = namespaces.new_pid_namespace()
        if why is None:
            report = os.pipe()
        else:  # the worker reports it before any of the learner's code runs
            os.environ[namespaces.REFUSED] = why
    keeper = procs.read(os.getpid())
    pid = os.fork()
    if pid == 0:
        if report is not None:
            os.close(report[0])
            _init(req, fresh, keeper, report[1])
        _run_worker(req, fresh)
    worker = pid
    if report is not None:
        os.close(report[1])
        worker = _worker_below(pid)
    me = procs.read(worker)
    write_whole(req["pid"], f"{os.getpid()} {worker} {me.start if me else 0}\n")
    while True:
        try:
            done, status = os.waitpid(-1, 0)
        except ChildProcessError:
            status = 0
            break
        if done == pid:
            break
    if report is not None:  # the worker's own status, as its init saw it (none if the init was killed)
        relayed = os.read(report[0], 64).decode().strip()
        status = int(relayed) if relayed.isdigit() else status
    code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    procs.kill_tree({os.getpid(): None})  # whatever is left below us, as in `_end_below`
    write_whole(req["pid"], f"{os.getpid()} {worker} {me.start if me else 0}\n{code}\n")
    os._exit(0)


def main() -> None:
    fresh = "--exec" in sys.argv[1:]
    judge = int(os.environ.get(procs.MARKER, "0"))
    signal.signal(signal.SIGTERM, _end_below)
    if judge and not procs.die_with_parent(signal.SIGTERM, judge):
        _end_below()
    procs.set_subreaper()  # orphans of a keeper that was killed come to us
    if not fresh:
        _preload()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # keepers (and orphans) are reaped automatically
    print("ready", flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        if req.get("cgroup"):
            _CGROUPS.difference_update([f for f in _CGROUPS if not os.path.isdir(f)])  # removed by the judge
            _CGROUPS.add(req["cgroup"])
        if not fresh:
            _load_cases(req["exercise"])
        server = os.getpid()
        if os.fork() == 0:
            _keep(req, fresh, server)
    while True:  # input closed (retired): the running workers finish first, then so do we
        try:
            os.wait()
        except ChildProcessError:
            break


if __name__ == "__main__":
    main()
