"""A fork server for grading workers on the CPU: import torch and the engine once, then fork one
worker per job instead of starting a fresh interpreter (which costs seconds each, and `check`
starts a hundred). Only used without CUDA: a CUDA context does not survive a fork.

Protocol: the runner writes one JSON line per job to our stdin ({"job", "err", "pid", "rc",
"rlimit_as"}). For each, a keeper process forks the worker, writes the worker's pid to `pid`,
waits for it and writes its exit status to `rc` (negative: killed by that signal).
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
import traceback


def _preload() -> None:
    import torch  # noqa: F401

    import minisgl.attention  # noqa: F401
    import minisgl.core  # noqa: F401
    import minisgl.engine  # noqa: F401
    import minisgl.kvcache  # noqa: F401
    import minisgl.models  # noqa: F401
    import minisgl.scheduler  # noqa: F401
    from judge import api, harness, install, registry, worker  # noqa: F401


def _write(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)  # the runner never sees half a number


def _run_worker(req: dict) -> None:
    """In the grandchild: become the worker."""
    os.setsid()  # its own process group, so a kill takes everything it started
    if req.get("rlimit_as"):
        resource.setrlimit(resource.RLIMIT_AS, (req["rlimit_as"], req["rlimit_as"]))
    fd = os.open(req["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
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


def _keep(req: dict) -> None:
    """In the child: fork the worker, report its pid, wait, report how it ended."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # waitpid needs children reported again
    pid = os.fork()
    if pid == 0:
        _run_worker(req)
    _write(req["pid"], str(pid))
    _, status = os.waitpid(pid, 0)
    code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    _write(req["rc"], str(code))
    os._exit(0)


def main() -> None:
    _preload()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # keepers are reaped automatically
    print("ready", flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        if os.fork() == 0:
            _keep(req)


if __name__ == "__main__":
    main()
