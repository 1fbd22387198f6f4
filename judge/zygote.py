"""The grading fork server: every worker is started by it, and every process a worker starts
stays below it (see `judge.procs`). On the CPU it imports torch and the engine once (and each
exercise's cases when a worker first needs them) and forks each worker from that state: starting
a fresh interpreter costs seconds, and `check` starts a hundred. With `--exec` (CUDA: a CUDA
context does not survive a fork) each worker is a fresh interpreter.

Protocol: the runner writes one JSON line per job to our stdin ({"exercise", "job", "err",
"pid", "rlimit_as"}). For each, a keeper process forks the worker, writes "KEEPER WORKER START"
(pids and the worker's start time) to `pid`, and waits. When the worker ends, the keeper kills
whatever the worker left behind and writes its exit status as `pid`'s second line (negative:
the signal).
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
import traceback

from judge import procs
from judge.files import write_whole  # the runner never sees half a line


def _preload() -> None:
    import torch  # noqa: F401

    import minisgl.attention  # noqa: F401
    import minisgl.core  # noqa: F401
    import minisgl.engine  # noqa: F401
    import minisgl.kvcache  # noqa: F401
    import minisgl.models  # noqa: F401
    import minisgl.scheduler  # noqa: F401
    from judge import api, harness, install, privileges, registry, sandbox, seccomp, speed, worker  # noqa: F401


def _load_cases(exercise_id: str) -> None:
    """Read an exercise's public cases here, before forking, so every worker has them before any
    learner code runs (this process never runs learner code). An instructor's hidden cases are
    read by the workers that run them, and no other: a worker's memory is the learner's to read."""
    from judge import registry

    try:
        registry.load(exercise_id)
    except Exception:  # a broken cases.py is reported by the worker that needs it
        pass


def _run_worker(req: dict, fresh: bool) -> None:
    """In the grandchild: become the worker."""
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


def _keep(req: dict, fresh: bool) -> None:
    """In the child: fork the worker, report its pid, reap what it orphans, report how it ended."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # waitpid needs children reported again
    procs.set_subreaper()  # the worker's orphans come to us
    pid = os.fork()
    if pid == 0:
        _run_worker(req, fresh)
    me = procs.read(pid)
    write_whole(req["pid"], f"{os.getpid()} {pid} {me.start if me else 0}\n")
    while True:
        try:
            done, status = os.waitpid(-1, 0)
        except ChildProcessError:
            status = 0
            break
        if done == pid:
            break
    code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    procs.kill_tree({c: None for c in procs.descendants([os.getpid()], procs.table()) if c != os.getpid()})
    write_whole(req["pid"], f"{os.getpid()} {pid} {me.start if me else 0}\n{code}\n")
    os._exit(0)


def main() -> None:
    fresh = "--exec" in sys.argv[1:]
    procs.set_subreaper()  # orphans of a keeper that was killed come to us
    if not fresh:
        _preload()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # keepers (and orphans) are reaped automatically
    print("ready", flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        if not fresh:
            _load_cases(req["exercise"])
        if os.fork() == 0:
            _keep(req, fresh)


if __name__ == "__main__":
    main()
