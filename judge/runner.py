"""Run cases in a `judge.worker` subprocess under a time limit per case and a memory limit.

A case that runs past its limit, or a process that grows past the memory limit, is killed; the
case is marked and the remaining cases continue in a fresh process. The judge itself never runs
learner code, and every process a worker starts is killed with it (`judge.procs`), so nothing
the learner writes can hang the judge or outlive its verdict.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import secrets
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Set

from tools.workbook_env import WORKBOOK

from . import cgroups, confinement, procs, registry, scratch
from .compare import well_formed
from .files import create_new
from .registry import REPO_ROOT
from .result import TEXT_LIMIT, Status, clip

STARTUP_S = 120.0  # a fresh interpreter: importing torch, the cases and the learner's file, before the first case
LOAD_S = 30.0  # a forked worker (torch and the engine already imported): loading the learner's file
STOPPED_S = 1.0  # a worker stopped (SIGSTOP) this long is ended: a stopped process never gets on

POLL_S = 0.05
SPAWN_S = 60.0  # a fork server that takes longer to start a worker is replaced
TREE_EVERY = 20  # polls between measurements of the memory of everything a worker started
MAX_PROCS = 64  # processes a worker may have running at once (with itself): more is a fork bomb
MAX_TIMEOUTS = 2  # after this many cases run out of time, the rest are not run
# Fork workers from a preloaded process on the CPU (MINISGL_JUDGE_FORK=0 starts each afresh).
USE_ZYGOTE = WORKBOOK.judge_fork


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
    timings: Optional[Dict[str, Dict[str, float]]] = None  # a timing run's result (judge.speed)


class ForkedProc:
    """A worker started by the fork server, with its keeper: enough of `subprocess.Popen` for the
    watch loop. Its end is read from the keeper's report or, if the learner's code killed the
    keeper, from /proc (the worker is then gone, and how it ended is unknown)."""

    def __init__(self, keeper: int, keeper_start: Optional[int], pid: int, start: int, pid_path: Path,
                 cgroup: Optional[Path] = None) -> None:
        self.keeper, self.keeper_start, self.pid, self.start, self._pid_path = keeper, keeper_start, pid, start, pid_path
        self.cgroup = cgroup  # the worker's capped cgroup (`judge.cgroups`), where there is one
        self.returncode: Optional[int] = None
        self.lost = False  # ended without its keeper's report

    def poll(self) -> Optional[int]:
        if self.returncode is None:
            lines = self._pid_path.read_text().split("\n") if self._pid_path.exists() else []
            if len(lines) > 1 and lines[1].strip():
                self.returncode = int(lines[1])
            elif not procs.alive(self.pid, self.start):
                self.returncode, self.lost = 1, True
        return self.returncode

    def how_it_ended(self) -> str:
        if self.lost:
            return "it ended after its supervisor was killed, so its exit status is unknown"
        code = self.returncode
        return f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"

    def kill(self) -> None:
        """End the worker, its keeper and everything either of them started."""
        Zygote.forget(self.keeper, self.pid)
        procs.kill_tree({self.keeper: self.keeper_start, self.pid: self.start}, strays=Zygote.strays)
        self.poll()
        if self.returncode is None:
            self.returncode, self.lost = -signal.SIGKILL, False


class _Lasting:
    """A thread that lasts as long as the judge. The kernel's parent-death signal (`procs.
    die_with_parent`) follows the thread that forked, not the process: a fork server started from
    a pool's thread would be killed when that thread ends, in the middle of other gradings."""

    _lock = threading.Lock()
    _jobs: Optional["queue.Queue"] = None
    _owner = 0

    @classmethod
    def call(cls, fn: Callable[[], Any]) -> Any:
        if threading.current_thread() is threading.main_thread():
            return fn()
        with cls._lock:
            if cls._jobs is None or cls._owner != os.getpid():
                cls._jobs, cls._owner = queue.Queue(), os.getpid()
                threading.Thread(target=cls._serve, args=(cls._jobs,), name="judge-fork-server-starter", daemon=True).start()
        done: "queue.Queue" = queue.Queue(1)
        cls._jobs.put((fn, done))
        ok, value = done.get()
        if not ok:
            raise value
        return value

    @staticmethod
    def _serve(jobs: "queue.Queue") -> None:
        while True:
            fn, done = jobs.get()
            try:
                done.put((True, fn()))
            except BaseException as exc:  # handed to the caller, who raises it
                done.put((False, exc))


class Zygote:
    """The fork server (one per judge process and mode), restarted when it died or when engine or
    judge files changed. `fresh` (CUDA): each worker is a new interpreter instead of a fork."""

    _lock = threading.RLock()  # re-entered: a spawn may stop a server, whose sweep takes it again
    _procs: Dict[bool, subprocess.Popen] = {}
    _stamps: Dict[bool, float] = {}
    _running: Dict[int, Optional[int]] = {}  # keepers and workers of running gradings: pid -> start time
    _retired: List[subprocess.Popen] = []  # servers told to exit once their running workers end

    @staticmethod
    def _sources_stamp() -> float:
        files = list((REPO_ROOT / "minisgl").rglob("*.py")) + list((REPO_ROOT / "judge").glob("*.py"))
        files += [f for pattern in ("*/cases.py", "*/exercise.toml") for f in (REPO_ROOT / "exercises").glob(pattern)]
        return max((f.stat().st_mtime for f in files), default=0.0)

    @classmethod
    def _ensure(cls, env, fresh: bool) -> subprocess.Popen:
        stamp = cls._sources_stamp()
        proc = cls._procs.get(fresh)
        if proc is not None and proc.poll() is not None:
            cls._stop(fresh)
            proc = None
        elif proc is not None and not fresh and stamp != cls._stamps.get(fresh):
            cls._retire(fresh)  # files changed: new workers come from a new server; running ones finish
            proc = None
        if proc is None:
            procs.set_subreaper()  # if the learner's code kills the fork server, its orphans come here
            # it dies with the judge (its marker names the judge, whose death it asks the kernel to signal)
            proc = _Lasting.call(lambda: subprocess.Popen(
                [sys.executable, "-m", "judge.zygote", *(["--exec"] if fresh else [])], cwd=str(REPO_ROOT),
                env=dict(env, **{procs.MARKER: str(os.getpid())}), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL, text=True, start_new_session=True,
            ))
            ready, _, _ = select.select([proc.stdout], [], [], STARTUP_S)  # never wait on a server that hangs
            if not ready or proc.stdout.readline().strip() != "ready":
                cls._procs[fresh] = proc
                cls._stop(fresh)
                raise RuntimeError("the grading fork server did not start")
            cls._procs[fresh], cls._stamps[fresh] = proc, stamp
        return proc

    @classmethod
    def spawn(cls, exercise_id: str, job: Path, err: Path, rlimit_as: Optional[int], env, fresh: bool,
              isolate: bool = False, cgroup: Optional[Path] = None) -> ForkedProc:
        """Start a worker for `job` (`isolate`: in namespaces of its own; `cgroup`: in that cgroup).
        A fork server that does not answer (the learner's code may have stopped it) is replaced by
        a new one, once."""
        pid_path = job.with_suffix(".pid")
        request = json.dumps({"exercise": exercise_id, "job": str(job), "err": str(err), "pid": str(pid_path),
                              "rlimit_as": rlimit_as, "namespaces": isolate, "cgroup": str(cgroup) if cgroup else None})
        with cls._lock:  # a keeper is registered before any sweep can take it for a stray
            for attempt in range(2):
                proc = cls._ensure(env, fresh)
                try:
                    proc.stdin.write(request + "\n")
                    proc.stdin.flush()
                    deadline = time.monotonic() + SPAWN_S
                    while not (pid_path.exists() and pid_path.read_text().strip()):
                        if time.monotonic() > deadline or proc.poll() is not None:
                            raise RuntimeError("the grading fork server did not start a worker")
                        server = procs.read(proc.pid)
                        if server is not None and server.state in ("T", "t"):  # stopped (SIGSTOP): it never will
                            raise RuntimeError("the grading fork server was stopped")
                        time.sleep(0.005)
                    break
                except (BrokenPipeError, OSError, RuntimeError) as exc:
                    cls._stop(fresh)
                    if attempt == 1:
                        raise RuntimeError(f"the grading fork server failed twice: {exc}") from exc
            keeper, pid, start = (int(x) for x in pid_path.read_text().split("\n")[0].split())
            kp = procs.read(keeper)
            cls._running[keeper], cls._running[pid] = (kp.start if kp else None), start
        return ForkedProc(keeper, cls._running[keeper], pid, start, pid_path, cgroup)

    @classmethod
    def forget(cls, *pids: int) -> None:
        with cls._lock:
            for pid in pids:
                cls._running.pop(pid, None)

    @classmethod
    def strays(cls, tab: Dict[int, "procs.Proc"]) -> Set[int]:
        """Processes adopted by the fork server or by the judge that are no running grading's
        keeper or worker: left behind by learner code that killed its keeper (or fork server)."""
        with cls._lock:
            cls._retired = [p for p in cls._retired if p.poll() is None]
            servers = {p.pid for p in [*cls._procs.values(), *cls._retired]}
            parents = servers | {os.getpid()}  # a dead server's orphans were adopted by the judge
            running = {k for k, start in cls._running.items() if k in tab and (start is None or tab[k].start == start)}
            # a live server's children are its keepers, so any other is a stray, marked or not (its
            # environment may be emptied by an exec); the judge's own children are ours only if marked
            return {p.pid for p in tab.values()
                    if p.pid not in servers and p.pid not in running
                    and (p.ppid in servers or (p.ppid in parents and procs.marked(p.pid)))}

    @classmethod
    def _close_input(cls, fresh: bool) -> Optional[subprocess.Popen]:
        """Forget the server (fresh or not) and close its input, which tells it to exit; None if there is none."""
        proc = cls._procs.pop(fresh, None)
        if proc is not None:
            try:
                proc.stdin.close()
            except OSError:
                pass
        return proc

    @classmethod
    def _retire(cls, fresh: bool) -> None:
        """Let a server go without killing the workers it started: with its input closed it exits
        once its keepers have (a keeper dies with its server), and is reaped then."""
        proc = cls._close_input(fresh)
        if proc is not None:
            cls._retired.append(proc)

    @classmethod
    def _stop(cls, fresh: bool) -> None:
        proc = cls._close_input(fresh)
        if proc is None:
            return
        if proc.poll() is None:  # alive (or not yet reaped), so its pid is still its own
            procs.kill_tree({proc.pid: None})
        proc.wait()
        procs.kill_tree({}, strays=cls.strays)  # a server that died left its orphans to the judge

    @classmethod
    def stop(cls) -> None:
        for fresh in list(cls._procs):
            cls._stop(fresh)
        for proc in cls._retired:
            if proc.poll() is None:
                procs.kill_tree({proc.pid: None})
            proc.wait()
        cls._retired = []


atexit.register(Zygote.stop)

_LIVE: set = set()  # worker processes running now, so an interrupt can end them all
_CANCEL = threading.Event()


def cancel_all() -> None:
    """Stop every running grading (a Ctrl-C in the notebook or terminal): kill the workers."""
    _CANCEL.set()
    for proc in list(_LIVE):
        proc.kill()


def reset_cancel() -> None:
    _CANCEL.clear()


def cancelled() -> bool:
    """Whether the gradings were interrupted (`cancel_all`) since the last `reset_cancel`."""
    return _CANCEL.is_set()


def sweep() -> None:
    """Kill whatever learner code left adopted by the fork server or by the judge."""
    procs.kill_tree({}, strays=Zygote.strays)


def run_cases(
    exercise_id: str,
    file: Optional[Path],
    cases: List[CaseJob],
    *,
    memory_limit_gb: float = 6.0,
    threads: int = 1,
    use_cuda: bool = False,
    on_done: Optional[Callable[[str, Dict[str, Any]], bool]] = None,
    speed: bool = False,
    cases_dir: Optional[Path] = None,
    sandbox: Optional[Dict[str, Any]] = None,
) -> WorkerReport:
    """Run `cases` with `file` installed (None: the reference engine). `on_done(case_id, event)`
    may return True to stop early (the rest are left out of the report). `speed`: instead of
    reporting each case, time the learner's piece against the engine's over them (`report.timings`).
    `cases_dir`: an instructor's folder of hidden cases (`<dir>/<id>/cases.py`), loaded beside the
    public ones. `sandbox`: extra paths the learner's code may not read (see `judge.sandbox`)."""
    report = WorkerReport()
    remaining = list(cases)
    limit = int(memory_limit_gb * (1 << 30))
    fresh = use_cuda or not USE_ZYGOTE
    confine = confinement.wanted()  # decided here, by the judge: the worker only carries it out
    with scratch.run_folders() as run:  # control files out of the graded code's reach; its TMPDIR beside them
        tmp = run.control
        attempt = 0
        while remaining:
            if _CANCEL.is_set():  # interrupted: no new worker
                report.fatal = report.fatal or {"status": Status.NOT_RUN, "error": "grading was interrupted"}
                return report
            attempt += 1
            tag = f"{attempt}-{secrets.token_hex(8)}"  # names no one can plant ahead (where nothing else keeps them out)
            out_path = Path(tmp) / f"events-{tag}.jsonl"
            err_path = Path(tmp) / f"stderr-{tag}.txt"
            job_path = Path(tmp) / f"job-{tag}.json"
            create_new(job_path, json.dumps({
                "exercise": exercise_id, "file": str(file) if file else None, "out": str(out_path), "repo": str(REPO_ROOT),
                "threads": threads, "speed": speed, "use_cuda": use_cuda, "cases": [{"id": c.id, "key": c.key, "seed": c.seed} for c in remaining],
                "cases_dir": str(cases_dir) if cases_dir else None, "scratch": str(run.scratch), "private": str(scratch.base()),
                "no_access": [str(registry.STATE_DIR), *(sandbox or {}).get("no_access", [])],  # the learner's record, wherever it is
                "confine": confine,
            }))
            create_new(out_path)
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
            # an address-space cap turns a runaway allocation into an error; CUDA maps too much for it
            events = open(out_path)  # held open: the learner's code deleting the file cannot blind us
            cgroup = cgroups.make()
            try:
                proc = Zygote.spawn(exercise_id, job_path, err_path, None if use_cuda else limit + (2 << 30), env, fresh,
                                    isolate=confine["namespaces"], cgroup=cgroup)
            except RuntimeError as exc:
                events.close()
                cgroups.remove(cgroup)
                report.fatal = {"status": Status.ERROR, "error": f"the judge could not start a grading process: {exc}"}
                return report
            _LIVE.add(proc)
            if _CANCEL.is_set():  # interrupted while it was starting: cancel_all found no process to end
                proc.kill()
            try:
                stop, killed_for = _watch(proc, events, remaining, report, limit, on_done, speed, STARTUP_S if fresh else LOAD_S)
            finally:
                proc.kill()  # whatever the run left behind ends with it
                _LIVE.discard(proc)
                events.close()
                cgroups.remove(cgroup)
            if _CANCEL.is_set():
                return report
            err_tail = (err_path.read_bytes()[-1500:].decode(errors="replace").strip() if err_path.exists() else "") or "(none)"
            if report.fatal is not None or stop or speed:
                if speed and report.timings is None and report.fatal is None:
                    report.fatal = killed_for or {"status": Status.ERROR, "error": f"the timing run ended early ({proc.how_it_ended()}):\n{err_tail}"}
                return report
            current = next((c for c in remaining if c.id not in report.results), None)
            if current is None:
                break
            if killed_for is None:  # the process died on its own in the middle of a case
                why = proc.how_it_ended()
                if report.fingerprint is None and current is remaining[0] and not _started(out_path):
                    report.fatal = {"status": Status.ERROR, "error": f"the grading process died before running any case ({why}):\n{err_tail}"}
                    return report
                report.results[current.id] = _ended(Status.ERROR, f"the grading process died during this case ({why}); its last output:\n{err_tail}")
            else:
                report.results[current.id] = killed_for
            if on_done is not None and on_done(current.id, report.results[current.id]):
                return report
            remaining = [c for c in remaining if c.id not in report.results]
            if sum(r.get("status") == Status.TIMEOUT for r in report.results.values()) >= MAX_TIMEOUTS:
                for c in remaining:  # an endless loop would cost every case its full limit
                    report.results[c.id] = _ended(Status.NOT_RUN, f"not run: {MAX_TIMEOUTS} cases already ran out of time")
                return report
    return report


def _ended(status: Status, error: str, seconds: float = 0.0) -> Dict[str, Any]:
    """A case's event when its run did not complete."""
    return {"completed": False, "status": status, "error": error, "obs": [], "seconds": seconds}


def _started(out_path: Path) -> bool:
    try:
        return '"event": "start"' in out_path.read_text()
    except FileNotFoundError:
        return False


_FAILURES = {"rejected": Status.REJECTED, "oom": Status.OOM, "error": Status.ERROR}


def failure_status(kind: Any) -> Status:
    """A failure the worker reports, as a verdict. The worker runs the learner's code, so what it
    says is an observation: it can only ever name a failure, never a pass."""
    return _FAILURES.get(kind, Status.ERROR) if isinstance(kind, str) else Status.ERROR


def _case_event(raw: Dict[str, Any]) -> Dict[str, Any]:
    """A case's `done` line as the parent keeps it: whether the case returned and what it
    recorded, every field checked; a status only where the case failed in the worker."""
    obs = raw.get("obs")
    seconds = raw.get("seconds")
    event = {"completed": raw.get("outcome") == "returned", "status": None, "error": clip(str(raw.get("error") or ""), TEXT_LIMIT),
             "obs": obs, "printed": clip(str(raw.get("printed") or ""), TEXT_LIMIT),
             "seconds": float(seconds) if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) else 0.0}
    if not well_formed(obs):
        event.update(completed=False, obs=[], status=Status.ERROR,
                     error="the grading process sent observations the judge cannot read (does your code change how cases record them?)")
    elif not event["completed"]:
        event["status"] = failure_status(raw.get("kind"))
    return event


_TOO_MANY = f"started more than {MAX_PROCS} processes at once (a fork bomb?); all of them were ended"


def _tree(proc: ForkedProc) -> Set[int]:
    """The worker and everything it started, counting the orphans its keeper (a subreaper) adopted."""
    root = proc.keeper if procs.alive(proc.keeper, proc.keeper_start) else proc.pid
    tab = procs.table()
    out = procs.descendants([root], tab)
    out.discard(proc.keeper)
    # ended ones are not counted: in its own pid namespace the worker adopts its orphans, and never reaps them
    return {pid for pid in out if tab[pid].state != "Z"}


def _fork_bomb(proc: ForkedProc, tree: Optional[Set[int]] = None) -> bool:
    """Too many processes now, or (in a capped cgroup) a fork the kernel refused at any time."""
    return len(_tree(proc) if tree is None else tree) > MAX_PROCS or cgroups.refused_forks(proc.cgroup) > 0


def _watch(proc, events, remaining, report, limit, on_done, speed=False, load_limit=STARTUP_S):
    """Follow the event file until the process ends. Returns (stopped early, result of a kill)."""
    timeouts = {c.id: c.timeout_s for c in remaining}
    speed_limit = sum(timeouts.values()) * 3  # the timing run repeats the cases, twice a round
    buf = ""
    current: Optional[str] = None
    started_at = time.monotonic()
    stopped_since: Optional[float] = None
    polls = 0
    while True:
        if _CANCEL.is_set():
            return False, None
        chunk = events.read()
        buf += chunk
        while "\n" in buf:
            line, buf = buf.split("\n", 1)
            try:
                event = json.loads(line)
                kind = event.pop("event")
            except (ValueError, KeyError, AttributeError):
                continue  # not the worker's: something else wrote to the file
            if kind == "fatal":
                report.fatal = {"status": failure_status(event.get("kind")), "error": clip(str(event.get("error") or ""), TEXT_LIMIT)}
            elif kind == "ready":
                if _fork_bomb(proc):
                    report.fatal = {"status": Status.ERROR, "error": _TOO_MANY}
                    return False, None
                fp, skipped = event.get("fingerprint"), event.get("skipped")
                # sent by the process that runs the learner's code: bounded before any note quotes it
                report.fingerprint = {clip(str(k), 100): clip(str(v), 200) for k, v in list(fp.items())[:8]} if isinstance(fp, dict) else {}
                report.skipped = [clip(str(x), 200) for x in skipped[:20]] if isinstance(skipped, list) else []
                started_at = time.monotonic()
            elif kind == "speed":
                report.timings = event.get("timings") if isinstance(event.get("timings"), dict) else None
                return False, None
            elif kind == "start" and event.get("case") in timeouts:
                current, started_at = event["case"], time.monotonic()
            elif kind == "done" and event.get("case") in timeouts:
                if _fork_bomb(proc):  # the case's processes are still there: its result does not count
                    return False, _ended(Status.ERROR, _TOO_MANY, time.monotonic() - started_at)
                finished, current = event["case"], None
                report.results[finished] = _case_event(event)
                if on_done is not None and on_done(finished, report.results[finished]):
                    return True, None
        if report.fatal is not None:
            return False, None
        if proc.poll() is not None and not chunk:
            return False, None
        if not speed and current is None and all(c.id in report.results for c in remaining):
            return False, None  # every case reported: a thread left running by the learner's code must not keep us
        now = time.monotonic()
        if current is None and report.fingerprint is None and now - started_at > load_limit:
            report.fatal = {"status": Status.TIMEOUT, "error": f"loading your file took more than {load_limit:.0f} s (does it run something at import time?)"}
            return False, None
        me = procs.read(proc.pid)
        if me is not None and me.state in ("T", "t"):  # stopped: it would sit there until a limit ran out
            stopped_since = stopped_since or now
            if now - stopped_since > STOPPED_S:
                result = _ended(Status.ERROR, "the grading process was stopped (SIGSTOP: does your code stop its own process?)", now - started_at)
                if current is None:
                    report.fatal = {k: result[k] for k in ("status", "error")}
                    return False, None
                return False, result
        else:
            stopped_since = None
        # memory first: a case that is both over memory and slow is slow because of the memory;
        # about once a second, with what the processes it started use too
        polls += 1
        used = procs.rss_bytes(proc.pid)
        if polls % TREE_EVERY == 0:
            tree = _tree(proc)
            if _fork_bomb(proc, tree):
                result = _ended(Status.ERROR, _TOO_MANY, now - started_at)
                if current is None:
                    report.fatal = {k: result[k] for k in ("status", "error")}
                    return False, None
                return False, result
            used = max(used, sum(procs.pss_bytes(pid) for pid in tree))
        if used > limit:
            result = _ended(Status.OOM, f"used more than {limit / 2**30:.1f} GiB of memory (with any processes it started)", now - started_at)
            if current is None:
                report.fatal = {k: result[k] for k in ("status", "error")}
                return False, None
            return False, result
        if speed and report.fingerprint is not None and now - started_at > speed_limit:
            return False, {"status": Status.TIMEOUT, "error": f"the timing run took more than {speed_limit:.0f} s"}
        if current is not None and now - started_at > timeouts[current]:
            return False, _ended(Status.TIMEOUT, f"no result after {timeouts[current]:.0f} s: an endless loop, or far too slow", now - started_at)
        time.sleep(POLL_S)
