"""Run cases in a `judge.worker` subprocess under a time limit per case and a memory limit.

A case that runs past its limit, or a process that grows past the memory limit, is killed; the
case is marked and the remaining cases continue in a fresh process. The judge itself never runs
learner code, so nothing the learner writes can hang or crash it.
"""

from __future__ import annotations

import atexit
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from .registry import REPO_ROOT

STARTUP_S = 120.0  # importing torch, the cases and the learner's file, before the first case
POLL_S = 0.05
MAX_TIMEOUTS = 2
# Fork workers from a preloaded process on the CPU (MINISGL_JUDGE_FORK=0 starts each afresh).
USE_ZYGOTE = os.environ.get("MINISGL_JUDGE_FORK", "1") != "0"  # after this many cases run out of time, the rest are not run


@dataclass
class CaseJob:
    id: str  # unique within a run: the case key, plus "#seed" for seeded cases
    key: str  # the case function's name
    seed: Optional[int]
    timeout_s: float


@dataclass
class WorkerReport:
    fatal: Optional[Dict[str, Any]] = None  # the file could not be installed: applies to every case
    fingerprint: Optional[Dict[str, str]] = None
    skipped: List[str] = field(default_factory=list)  # optional helpers the learner left out
    results: Dict[str, Dict[str, Any]] = field(default_factory=dict)  # case id -> done event


def _rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return 0


def _limit_address_space(limit_bytes: Optional[int]) -> Callable[[], None]:
    def apply() -> None:
        if limit_bytes:
            resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))

    return apply


class ForkedProc:
    """A worker forked by the zygote: enough of `subprocess.Popen` for the watch loop."""

    def __init__(self, pid: int, rc_path: Path) -> None:
        self.pid, self._rc_path, self.returncode = pid, rc_path, None

    def poll(self) -> Optional[int]:
        if self.returncode is None and self._rc_path.exists():
            self.returncode = int(self._rc_path.read_text())
        return self.returncode

    def wait(self) -> int:
        while self.poll() is None:
            time.sleep(POLL_S)
        return self.returncode


class Zygote:
    """One fork server per judge process (CPU only), restarted when engine or judge files change."""

    _lock = threading.Lock()
    _proc: Optional[subprocess.Popen] = None
    _stamp: float = 0.0

    @staticmethod
    def _sources_stamp() -> float:
        files = list((REPO_ROOT / "minisgl").rglob("*.py")) + list((REPO_ROOT / "judge").glob("*.py"))
        return max((f.stat().st_mtime for f in files), default=0.0)

    @classmethod
    def _ensure(cls, env) -> subprocess.Popen:
        stamp = cls._sources_stamp()
        if cls._proc is not None and (cls._proc.poll() is not None or stamp != cls._stamp):
            cls.stop()
        if cls._proc is None:
            cls._proc = subprocess.Popen(
                [sys.executable, "-m", "judge.zygote"], cwd=str(REPO_ROOT), env=env, stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True,
            )
            if cls._proc.stdout.readline().strip() != "ready":
                cls.stop()
                raise RuntimeError("the grading fork server did not start")
            cls._stamp = stamp
        return cls._proc

    @classmethod
    def spawn(cls, job: Path, err: Path, rlimit_as: Optional[int], env) -> ForkedProc:
        pid_path, rc_path = job.with_suffix(".pid"), job.with_suffix(".rc")
        with cls._lock:
            proc = cls._ensure(env)
            proc.stdin.write(json.dumps({"job": str(job), "err": str(err), "pid": str(pid_path), "rc": str(rc_path), "rlimit_as": rlimit_as}) + "\n")
            proc.stdin.flush()
        deadline = time.monotonic() + 60
        while not pid_path.exists():
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("the grading fork server did not start a worker")
            time.sleep(0.01)
        return ForkedProc(int(pid_path.read_text()), rc_path)

    @classmethod
    def stop(cls) -> None:
        if cls._proc is not None:
            try:
                os.killpg(cls._proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            cls._proc.wait()
            cls._proc = None


atexit.register(Zygote.stop)

_LIVE: set = set()  # worker processes running now, so an interrupt can end them all
_CANCEL = threading.Event()


def cancel_all() -> None:
    """Stop every running grading (a Ctrl-C in the notebook or terminal): kill the workers."""
    _CANCEL.set()
    for proc in list(_LIVE):
        _kill(proc)


def reset_cancel() -> None:
    _CANCEL.clear()


def _kill(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # not yet the leader of its own group
        try:
            os.kill(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


def run_cases(
    exercise_id: str,
    file: Optional[Path],
    cases: List[CaseJob],
    *,
    memory_limit_gb: float = 6.0,
    threads: int = 1,
    use_cuda: bool = False,
    on_done: Optional[Callable[[str, Dict[str, Any]], bool]] = None,
) -> WorkerReport:
    """Run `cases` with `file` installed (None: the reference engine). `on_done(case_id, event)`
    may return True to stop early (the rest are left out of the report)."""
    report = WorkerReport()
    remaining = list(cases)
    limit = int(memory_limit_gb * (1 << 30))
    with tempfile.TemporaryDirectory(prefix="judge-") as tmp:
        attempt = 0
        while remaining:
            attempt += 1
            out_path = Path(tmp) / f"events-{attempt}.jsonl"
            err_path = Path(tmp) / f"stderr-{attempt}.txt"
            job_path = Path(tmp) / f"job-{attempt}.json"
            job_path.write_text(json.dumps({
                "exercise": exercise_id, "file": str(file) if file else None, "out": str(out_path), "repo": str(REPO_ROOT),
                "threads": threads, "cases": [{"id": c.id, "key": c.key, "seed": c.seed} for c in remaining],
            }))
            out_path.touch()
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
            if use_cuda or not USE_ZYGOTE:
                with open(err_path, "wb") as err:
                    proc = subprocess.Popen(
                        [sys.executable, "-m", "judge.worker", str(job_path)], cwd=str(REPO_ROOT), env=env,
                        stdout=err, stderr=err, stdin=subprocess.DEVNULL, start_new_session=True,
                        # an address-space cap turns a runaway allocation into an error; CUDA maps too much for it
                        preexec_fn=_limit_address_space(None if use_cuda else limit + (2 << 30)),
                    )
            else:
                proc = Zygote.spawn(job_path, err_path, limit + (2 << 30), env)
            _LIVE.add(proc)
            try:
                stop, killed_for = _watch(proc, out_path, remaining, report, limit, on_done)
            finally:
                _LIVE.discard(proc)
            if _CANCEL.is_set():
                return report
            err_tail = (err_path.read_bytes()[-1500:].decode(errors="replace").strip() if err_path.exists() else "") or "(none)"
            if report.fatal is not None or stop:
                return report
            current = next((c for c in remaining if c.id not in report.results), None)
            if current is None:
                break
            if killed_for is None:  # the process died on its own in the middle of a case
                code = proc.returncode
                why = f"killed by signal {-code}" if code and code < 0 else f"exit code {code}"
                if report.fingerprint is None and current is remaining[0] and not _started(out_path):
                    report.fatal = {"status": "error", "error": f"the grading process died before running any case ({why}):\n{err_tail}"}
                    return report
                report.results[current.id] = {"status": "error", "error": f"the grading process died during this case ({why}); its last output:\n{err_tail}", "obs": [], "seconds": 0.0}
            else:
                report.results[current.id] = killed_for
            if on_done is not None and on_done(current.id, report.results[current.id]):
                return report
            remaining = [c for c in remaining if c.id not in report.results]
            if sum(r["status"] == "timeout" for r in report.results.values()) >= MAX_TIMEOUTS:
                for c in remaining:  # an endless loop would cost every case its full limit
                    report.results[c.id] = {"status": "error", "error": f"not run: {MAX_TIMEOUTS} cases already ran out of time", "obs": [], "seconds": 0.0}
                return report
    return report


def _started(out_path: Path) -> bool:
    return '"event": "start"' in out_path.read_text()


def _watch(proc, out_path, remaining, report, limit, on_done):
    """Follow the event file until the process ends. Returns (stopped early, result of a kill)."""
    timeouts = {c.id: c.timeout_s for c in remaining}
    pos = 0
    buf = ""
    current: Optional[str] = None
    started_at = time.monotonic()
    while True:
        with open(out_path) as f:
            f.seek(pos)
            chunk = f.read()
            pos = f.tell()
        buf += chunk
        while "\n" in buf:
            line, buf = buf.split("\n", 1)
            event = json.loads(line)
            kind = event.pop("event")
            if kind == "fatal":
                report.fatal = event
            elif kind == "ready":
                report.fingerprint, report.skipped = event["fingerprint"], event["skipped"]
            elif kind == "start":
                current, started_at = event["case"], time.monotonic()
            elif kind == "done":
                report.results[event.pop("case")] = event
                finished, current = current, None
                if on_done is not None and on_done(finished, report.results[finished]):
                    _kill(proc)
                    return True, None
        if proc.poll() is not None and not chunk:
            return False, None
        if current is None and all(c.id in report.results for c in remaining):
            _kill(proc)  # every case reported: a thread left running by the learner's code must not keep us
            return False, None
        now = time.monotonic()
        if current is None and report.fingerprint is None and now - started_at > STARTUP_S:
            _kill(proc)
            report.fatal = {"status": "timeout", "error": f"loading your file took more than {STARTUP_S:.0f} s (does it run something at import time?)"}
            return False, None
        # memory first: a case that is both over memory and slow is slow because of the memory
        if _rss_bytes(proc.pid) > limit:
            _kill(proc)
            result = {"status": "oom", "error": f"used more than {limit / 2**30:.1f} GiB of memory", "obs": [], "seconds": now - started_at}
            if current is None:
                report.fatal = dict(result)
                return False, None
            return False, result
        if current is not None and now - started_at > timeouts[current]:
            _kill(proc)
            return False, {"status": "timeout", "error": f"no result after {timeouts[current]:.0f} s: an endless loop, or far too slow", "obs": [], "seconds": now - started_at}
        time.sleep(POLL_S)
