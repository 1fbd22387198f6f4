"""A hostile learner's file against the judge, one test per kind of attack: what it reads, what it
writes, what it signals, what it leaves running, what it makes the judge print or believe.

Each grades req-lengths (the cheapest exercise) once or twice. The learner's code reports what it
managed into a file in the test's own folder (the graded code may write there), and the test
asserts it managed nothing."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import functools
import subprocess
import sys

import pytest

from judge import cgroups, confinement, formats, grade, namespaces, procs, registry, sandbox, scratch, seccomp, variants
from judge.compare import first_difference
from judge.result import TEXT_LIMIT

REPO = Path(__file__).resolve().parent.parent
EX = "req-lengths"
SOLUTION = variants.solution_file(EX)
WRONG = variants.variant_file(EX, variants.declared(EX)[0].name)
BODY = "        return self.device_len - self.cached_len"  # Req.extend_len in the answer

# JUDGE_TEST_WITHOUT=landlock,seccomp,namespaces,cgroups: run these tests as on a machine without them (the
# judge decides what each worker sets up, so turning a feature off in this process turns it off)
WITHOUT = {w for w in os.environ.get("JUDGE_TEST_WITHOUT", "").split(",") if w}


@pytest.fixture(autouse=True)
def _machine(monkeypatch: pytest.MonkeyPatch) -> None:
    if "landlock" in WITHOUT:
        monkeypatch.setattr(sandbox, "abi_version", lambda: 0)
        monkeypatch.setattr(sandbox, "available", lambda: False)
        monkeypatch.setattr(sandbox, "scopes_signals", lambda: False)
    if "seccomp" in WITHOUT:
        monkeypatch.setattr(seccomp, "available", lambda: False)
    if "namespaces" in WITHOUT:
        monkeypatch.setattr(namespaces, "available", lambda: False)
    if "cgroups" in WITHOUT:
        monkeypatch.setattr(cgroups, "available", lambda: False)
        monkeypatch.setattr(cgroups, "make", lambda: None)


@pytest.fixture
def fork_server(monkeypatch: pytest.MonkeyPatch):
    """Grade on the CPU with a fork server, as a machine without a GPU does: on a GPU (or with
    MINISGL_JUDGE_FORK=0) each worker is a fresh interpreter and there is no server to attack."""
    import importlib

    from judge import runner

    monkeypatch.setattr(runner, "USE_ZYGOTE", True)
    monkeypatch.setattr(importlib.import_module("judge.grade"), "cuda_available", lambda: False)
    return runner


def requires(*names: str):
    """A test of what a protection of `judge.confinement` stops. Where this machine lacks one, the
    test asserts instead that the judge refuses to grade a class here unless told to go on."""
    def wrap(test):
        @functools.wraps(test)
        def run(*args, **kwargs):
            gaps = [p.name for p in confinement.missing()]
            if any(n in gaps for n in names):
                with pytest.raises(confinement.WeakSandboxError, match="missing: .*" + next(n for n in names if n in gaps)):
                    confinement.require(allow_weaker=False)
                assert confinement.require(allow_weaker=True)  # told to: it grades, and says what is missing
                return
            test(*args, **kwargs)
        return run
    return wrap


def _learner(tmp_path: Path, name: str, prefix: str, source: Path = SOLUTION) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(prefix + source.read_text())
    return path


# ---- reading what grades it ----------------------------------------------------------------------
@requires("files")
def test_git_objects_are_out_of_reach(tmp_path: Path) -> None:
    # the recorded references are in git's objects too: `git show HEAD:judge/reference/...`
    leak = tmp_path / "leak"
    path = _learner(tmp_path, "git_show", f"""import subprocess as _sp
_r = _sp.run(["git", "-C", {str(REPO)!r}, "show", "HEAD:judge/reference/{EX}.json"], capture_output=True)
open({str(leak)!r}, "w").write(str(len(_r.stdout)))
""")
    assert grade(EX, path, seed=1, save=False).ok
    assert leak.read_text() == "0"


# ---- writing where the judge writes ----------------------------------------------------------------
@requires("files")
def test_planted_links_and_other_runs_files_are_out_of_reach(tmp_path: Path) -> None:
    # links named like the next attempt's control files, in the worker's TMPDIR; then a crash in a
    # case, so the judge starts a second worker and writes that attempt's files
    canary = tmp_path / "canary"
    canary.write_text("untouched")
    leak = tmp_path / "leak"
    path = _learner(tmp_path, "plants", f"""import glob as _glob, os as _os, tempfile as _tf
_own = _os.path.realpath(_tf.gettempdir())
_hits = []
for _f in _glob.glob({str(scratch.base())!r} + "/**/*", recursive=True):
    if _os.path.isfile(_f) and not _os.path.realpath(_os.path.dirname(_f)).startswith(_own):
        try:
            open(_f, "a").close()
            _hits.append(_f)
        except OSError:
            pass
for _n in ("job-2.json", "events-2.jsonl", "stderr-2.txt", "job-2.pid"):
    try:
        _os.symlink({str(canary)!r}, _os.path.join(_own, _n))
    except OSError:
        pass
open({str(leak)!r}, "w").write("\\n".join(_hits))
""")
    crash_once = ("        import os, tempfile\n        _flag = os.path.join(tempfile.gettempdir(), 'crashed')\n"
                  "        if not os.path.exists(_flag):\n            open(_flag, 'w').close()\n            os._exit(3)\n")
    path.write_text(path.read_text().replace(BODY, crash_once + BODY))
    result = grade(EX, path, seed=1, save=False)
    assert [c.status for c in result.cases].count("error") == 1 and result.passed == result.total - 1, str(result)
    assert canary.read_text() == "untouched"
    assert leak.read_text() == "", leak.read_text()  # no control file of the judge's, of the reference's, of another run


@requires("metadata")
def test_permissions_times_and_attributes_stay_as_they_are(tmp_path: Path) -> None:
    # Landlock guards contents, not metadata: `chmod 000` on a file it may read would break every later grading
    target = tmp_path / "a file the graded code may read"
    target.write_text("x")
    before = target.stat()
    leak = tmp_path / "leak"
    path = _learner(tmp_path, "metadata", f"""import os as _os
_done = []
for _name, _call in (("chmod", lambda: _os.chmod({str(target)!r}, 0)), ("utime", lambda: _os.utime({str(target)!r}, (0, 0))),
                     ("setxattr", lambda: _os.setxattr({str(target)!r}, "user.judge", b"1")),
                     ("fchmod", lambda: _os.fchmod(_os.open({str(target)!r}, _os.O_RDONLY), 0))):
    try:
        _call()
        _done.append(_name)
    except OSError:
        pass
open({str(leak)!r}, "w").write(" ".join(_done))
""")
    try:
        assert grade(EX, path, seed=1, save=False).ok
        assert leak.read_text() == ""
        after = target.stat()
        assert (after.st_mode, after.st_mtime_ns) == (before.st_mode, before.st_mtime_ns)
    finally:
        target.chmod(0o644)


@requires("network")
def test_no_tcp_connection_leaves_the_worker(tmp_path: Path) -> None:
    import socket

    server = socket.create_server(("127.0.0.1", 0))  # a listener on this machine the graded code could report to
    port = server.getsockname()[1]
    leak = tmp_path / "leak"
    path = _learner(tmp_path, "tcp", f"""import socket as _socket
try:
    _socket.create_connection(("127.0.0.1", {port}), timeout=5).close()
    open({str(leak)!r}, "w").write("connected")
except OSError:
    open({str(leak)!r}, "w").write("refused")
""")
    try:
        assert grade(EX, path, seed=1, save=False).ok
        assert leak.read_text() == "refused"
    finally:
        server.close()


@requires("files")
@pytest.mark.skipif(os.geteuid() != 0, reason="the judge runs as an ordinary user here: no privileges to drop")
def test_root_keeps_no_power_beyond_files(tmp_path: Path) -> None:
    # as in a Gradescope container: raw disks, the kernel's parameters, capabilities (each only
    # opened or read, never written: the test must be harmless where the judge fails it)
    from judge import privileges

    leak = tmp_path / "leak"
    path = _learner(tmp_path, "root", f"""import os as _os, stat as _stat
_got = []
for _e in _os.scandir("/dev"):
    if _stat.S_ISBLK(_e.stat(follow_symlinks=False).st_mode):
        try:
            _os.close(_os.open(_e.path, _os.O_RDONLY))
            _got.append(_e.path)
        except OSError:
            pass
for _p in ("/proc/sys/kernel/hostname", "/proc/sysrq-trigger", "/proc/self/oom_score_adj"):
    try:
        _os.close(_os.open(_p, _os.O_WRONLY))
        _got.append(_p)
    except OSError:
        pass
_caps = next(int(l.split()[1], 16) for l in open("/proc/self/status") if l.startswith("CapEff:"))
if _caps & ~{privileges.KEPT}:
    _got.append(hex(_caps))
open({str(leak)!r}, "w").write(" ".join(_got))
""")
    assert grade(EX, path, seed=1, save=False).ok
    assert leak.read_text() == ""


# ---- signals and processes ---------------------------------------------------------------------------
@requires("processes")
@pytest.mark.parametrize("workers", ["forked", "fresh"])
def test_signals_reach_no_process_outside_the_worker(tmp_path: Path, fork_server, workers: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # signal 0 asks the kernel whether a signal would be delivered, and delivers none; the pids
    # are the judge's view of them (in a pid namespace of its own the worker sees none of them).
    # "fresh": each worker a new interpreter, as on a GPU, with no fork server to reach
    runner = fork_server
    targets = [os.getpid()]
    if workers == "forked":
        assert grade(EX, SOLUTION, seed=1, save=False).ok  # a fork server is running
        targets.append(runner.Zygote._procs[False].pid)
    else:
        monkeypatch.setattr(runner, "USE_ZYGOTE", False)
    leak = tmp_path / "leak"
    path = _learner(tmp_path, "signals", f"""import os as _os
_reached = []
for _pid in ({", ".join(map(str, targets))}, int(_os.environ["MINISGL_JUDGE_PROCESS"])):
    try:
        _os.kill(_pid, 0)
        _reached.append(_pid)
    except OSError:
        pass
open({str(leak)!r}, "w").write(" ".join(map(str, _reached)))
""")
    assert grade(EX, path, seed=1, save=False).ok
    assert leak.read_text() == ""  # not the fork server, not the judge


def test_a_grading_on_the_gpu_never_runs_the_learners_code_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    # the judge grades on the GPU where it sees one, and its reference runs there; a confined worker
    # that cannot open the GPU once ran the learner's code on the CPU, whose outputs then differed
    # from the reference's. Here no GPU exists, so the worker's GPU cannot be opened, as it could
    # not under the sandbox: the grading must end in an error that says so, not in a verdict
    import torch

    if torch.cuda.is_available():
        pytest.skip("needs a machine without a GPU, to stand for a GPU the confined worker cannot open")
    monkeypatch.setattr(sys.modules["judge.grade"], "cuda_available", lambda: True)
    result = grade(EX, SOLUTION, seed=1, save=False)
    assert not result.ok
    assert "could not open it" in str(result), str(result)


@pytest.mark.parametrize("machine", ["as it is", "without namespaces"])
def test_namespaces_hide_processes_and_the_network(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, machine: str) -> None:
    # what the graded code sees of the machine's processes, whether it reaches the judge, whether a
    # UDP datagram (which Landlock does not stop) gets to a listener on this machine
    import socket

    if machine != "as it is":
        monkeypatch.setattr(namespaces, "available", lambda: False)
    listener = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    listener.bind(("127.0.0.1", 0))
    listener.settimeout(3)
    leak = tmp_path / "leak"
    path = _learner(tmp_path, "looks_around", f"""import json as _json, os as _os, socket as _socket
_seen = [int(p) for p in _os.listdir("/proc") if p.isdigit()]
try:
    _os.kill({os.getpid()}, 0)
    _reached = True
except OSError:
    _reached = False
try:
    _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM).sendto(b"out", ("127.0.0.1", {listener.getsockname()[1]}))
except OSError:
    pass
open({str(leak)!r}, "w").write(_json.dumps({{"seen": _seen, "me": _os.getpid(), "reached": _reached}}))
""")
    try:
        assert grade(EX, path, seed=1, save=False).ok
        try:
            received = listener.recv(16) == b"out"
        except socket.timeout:
            received = False
    finally:
        listener.close()
    got = json.loads(leak.read_text())
    missing = {p.name for p in confinement.missing()}
    if namespaces.available():
        # its namespace's first process (pid 1, which reaps its orphans) and itself, nothing else
        assert sorted(got["seen"]) == [1, got["me"]] == [1, 2] and not got["reached"] and not received, got
        assert not missing & {"network", "processes"}
    else:  # what the judge cannot stop here is what it says is missing, and a class is not graded so
        assert os.getpid() in got["seen"] and received, got
        assert got["reached"] == (not sandbox.scopes_signals()) == ("processes" in missing)
        assert "network" in missing
        with pytest.raises(confinement.WeakSandboxError):
            confinement.require(allow_weaker=False)


def test_a_stopped_fork_server_costs_no_time(fork_server) -> None:
    # where signals are not scoped, graded code can SIGSTOP the fork server; here the test does it
    runner = fork_server
    assert grade(EX, SOLUTION, seed=1, save=False).ok  # a fork server is running
    server = runner.Zygote._procs[False]
    os.kill(server.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        assert grade(EX, SOLUTION, seed=1, save=False).ok
        assert time.monotonic() - t0 < 30  # not the minute a silent server is given
        assert runner.Zygote._procs[False].pid != server.pid
    finally:
        if server.poll() is None:  # replaced servers are killed: this one should be gone
            os.kill(server.pid, signal.SIGCONT)


def test_orphans_count_toward_the_process_limit(tmp_path: Path) -> None:
    # seventy grandchildren, each orphaned at once (its parent exits): none is the worker's
    # descendant any more, but all are still its doing
    from judge.runner import MAX_PROCS

    token = f"orphans-{os.getpid()}-{time.monotonic_ns()}"
    path = _learner(tmp_path, "orphans", f"""import os as _os, time as _time
for _ in range({MAX_PROCS + 6}):
    if _os.fork() == 0:
        if _os.fork() == 0:
            _os.execv("/bin/sh", ["sh", "-c", "sleep 600 # {token}"])
        _os._exit(0)
    _os.wait()
_time.sleep(3)
""")
    try:
        result = grade(EX, path, seed=1, save=False)
        assert result.cases[0].status == "error" and "fork bomb" in result.cases[0].message, str(result)
        time.sleep(0.5)
        assert _with_token(token) == []
    finally:
        for pid in _with_token(token):
            os.kill(pid, signal.SIGKILL)


def test_a_fork_bomb_is_always_seen_where_a_cgroup_caps_it(tmp_path: Path) -> None:
    # children that live two seconds each, started as fast as the machine forks: whether a look
    # at the process table catches more than the limit depends on the machine's load; a cap does not
    leak = tmp_path / "leak"
    path = _learner(tmp_path, "bomb", f"""import os as _os, time as _time
_kids, _refused = [], 0
for _ in range({cgroups.MAX_TASKS + 50}):
    try:
        _pid = _os.fork()
    except OSError:
        _refused += 1
        break
    if _pid == 0:
        _time.sleep(2)
        _os._exit(0)
    _kids.append(_pid)
for _p in _kids:
    _os.waitpid(_p, 0)
open({str(leak)!r}, "w").write(str(_refused))
""")
    result = grade(EX, path, seed=1, save=False)
    if cgroups.available():  # ended by a look, or after the kernel refused a fork (then the file says so)
        assert not leak.exists() or leak.read_text() == "1", leak.read_text()
        assert result.cases[0].status == "error" and "fork bomb" in result.cases[0].message, str(result)
    else:  # only looking: the verdict may go either way, and the judge says so
        assert "counted by looking" in confinement.describe()


def _with_token(token: str) -> list:
    out = []
    for name in os.listdir("/proc"):
        try:
            if name.isdigit() and token.encode() in open(f"/proc/{name}/cmdline", "rb").read():
                out.append(int(name))
        except OSError:
            pass
    return out


def test_nothing_outlives_the_grading(tmp_path: Path) -> None:
    # a double fork whose grandchild execs a shell with an empty environment (no marker of the
    # judge's), then an attempt on the keeper that would leave the grandchild to the fork server
    token = f"outlives-{os.getpid()}-{time.monotonic_ns()}"
    path = _learner(tmp_path, "outlives", f"""import os as _os, signal as _signal, time as _time
if _os.fork() == 0:
    if _os.fork() == 0:
        _os.setsid()
        _os.execve("/bin/sh", ["sh", "-c", "while :; do sleep 1; done # {token}"], {{}})
    _os._exit(0)
_time.sleep(0.5)
try:
    _os.kill(_os.getppid(), _signal.SIGKILL)
except OSError:
    pass
""")
    try:
        result = grade(EX, path, seed=1, save=False)
        assert result.ok, str(result)
        time.sleep(0.5)
        assert _with_token(token) == []
    finally:
        for pid in _with_token(token):
            os.kill(pid, signal.SIGKILL)


def _of_grading(judge: int, token: str) -> list:
    """Live processes that a judge started (its marker), or whose command line holds `token` (a
    learner's process that emptied its environment)."""
    out = []
    for pid, p in procs.table().items():
        if p.state == "Z" or pid == os.getpid():
            continue
        try:
            cmdline = open(f"/proc/{pid}/cmdline", "rb").read()
        except OSError:
            continue
        if token.encode() in cmdline or procs.marked(pid, judge):
            out.append(pid)
    return out


def _described(pids: list) -> str:
    """What each of `pids` is, for a failure message: its state, parent and command line."""
    lines = []
    for pid in pids:
        p = procs.read(pid)
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ")[:100].decode(errors="replace")
        except OSError:
            cmd = "?"
        lines.append(f"{pid}: gone" if p is None else f"{pid}: state {p.state}, parent {p.ppid}, {cmd}")
    return "still running: " + "; ".join(lines)


# grade-all in a process of its own; "namespaces" off: as on a machine that refuses them
_GRADE_ALL = """import sys
from judge import cli, namespaces
if sys.argv[1] == "off":
    namespaces.available = lambda: False
sys.exit(cli.main(sys.argv[2:]))
"""


@pytest.mark.parametrize("namespaces_", ["as the machine has them", "off"])
def test_nothing_outlives_a_killed_judge(tmp_path: Path, namespaces_: str) -> None:
    # the judge is SIGKILLed while a learner's case loops and a detached shell (empty environment,
    # its own session) loops beside it: the fork server, the keeper, the worker and the shell must all end
    token = f"killed-judge-{os.getpid()}-{time.monotonic_ns()}"
    running = tmp_path / "running"
    running.write_text("")
    loop = (f"        import os\n        if os.fork() == 0:\n            if os.fork() == 0:\n                os.setsid()\n"
            f"                os.execve('/bin/sh', ['sh', '-c', 'while :; do sleep 1; done # {token}'], {{}})\n"
            f"            os._exit(0)\n        open({str(running)!r}, 'w').write('yes')\n        while True:\n            pass\n")
    subs = _class(tmp_path, {"hangs": SOLUTION.read_text().replace(BODY, loop + BODY)})
    proc = subprocess.Popen([sys.executable, "-c", _GRADE_ALL, "off" if namespaces_ == "off" else "on", "grade-all", str(subs),
                             "--exercise", EX, "--jobs", "1", "--seed", "1", "--out", str(tmp_path / "grades"), confinement.FLAG],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: list = []
    try:
        deadline = time.monotonic() + 120
        while running.read_text() != "yes" and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert running.read_text() == "yes", proc.communicate(timeout=5)[0][-3000:]
        time.sleep(0.5)
        seen = _of_grading(proc.pid, token)
        assert len(seen) >= 4, seen  # the fork server, the keeper, the worker, the shell at least
        proc.kill()
        proc.wait()
        # the fork server's and keepers' handlers scan /proc and kill bottom up: seconds on a loaded
        # machine (a fresh-clone run on 2 busy cores took over 5); before, they lived for minutes
        deadline = time.monotonic() + 30
        while _of_grading(proc.pid, token) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = _of_grading(proc.pid, token)
        assert left == [], _described(left)
        if cgroups.available():  # nor the cgroups made for its workers
            while list(cgroups.root().glob(f"minisgl-judge-{proc.pid}-*")) and time.monotonic() < deadline + 3:
                time.sleep(0.1)
            assert list(cgroups.root().glob(f"minisgl-judge-{proc.pid}-*")) == []
    finally:
        proc.kill()
        for pid in _of_grading(proc.pid, token):
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
        for pid in seen:  # those this process adopted (a subreaper, once it graded): not left as zombies
            procs.reap(pid)


def _looping_shell(token: str) -> subprocess.Popen:
    """A shell that forks a `sleep` again as soon as one ends, with `token` in its command line; once it has one."""
    shell = subprocess.Popen(["sh", "-c", f"while :; do sleep 1; done # {token}"])
    deadline = time.monotonic() + 10
    while not procs.children(shell.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert procs.children(shell.pid), "the shell started no sleep"
    return shell


def test_kill_tree_ends_a_root_that_keeps_forking() -> None:
    # a root is killed once nothing below it is left; the shell forks a new sleep as soon as the
    # last is killed, so every look found one below it, and the shell outlived all the passes
    shell = _looping_shell(f"forking-root-{os.getpid()}-{time.monotonic_ns()}")
    try:
        procs.kill_tree({shell.pid: None}, passes=50)
        assert not procs.alive(shell.pid), _described([shell.pid])
    finally:
        shell.kill()
        shell.wait()


# the fork server's SIGTERM handler, in a process of its own (it exits): a process forked while the
# handler looks at /proc (here: on its first look, and not in what that look returns) must end too
_END_BELOW = """import subprocess, sys
from judge import procs, zygote
procs.set_subreaper()
scan, late = procs.table, []
def table():
    tab = scan()
    if not late:
        late.append(subprocess.Popen(["sh", "-c", "while :; do sleep 1; done # " + sys.argv[1]],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return tab
procs.table = table
zygote._end_below()
"""


def test_the_fork_servers_handler_ends_what_is_forked_while_it_looks() -> None:
    token = f"forked-while-looking-{os.getpid()}-{time.monotonic_ns()}"
    try:
        done = subprocess.run([sys.executable, "-c", _END_BELOW, token], cwd=REPO, capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 1, done.stderr[-3000:]  # the handler's own exit
        left = _of_grading(-1, token)  # -1: no judge's marker, the token alone
        assert left == [], _described(left)
    finally:
        for pid in _of_grading(-1, token):
            os.kill(pid, signal.SIGKILL)


# ---- what the judge believes and prints ------------------------------------------------------------
def test_a_tolerance_comparison_counts_values_before_comparing_them() -> None:
    def close(values, shape):
        return [{"label": "logits", "kind": "close", "dtype": "torch.float32", "shape": shape, "value": values}]

    expected = close([1.0, 2.0, 3.0, 4.0], [2, 2])
    assert first_difference(close([1.0, 2.0, 3.0, 4.0], [2, 2]), expected) is None
    assert first_difference(close([1.0, 2.0], [2, 2]), expected) is not None  # fewer values than the shape holds
    assert first_difference(close([], [2, 2]), expected) is not None
    from judge.compare import well_formed

    assert not well_formed(close([1.0], [2, 2])) and well_formed(expected)


def test_learner_text_is_capped_in_every_output(tmp_path: Path) -> None:
    path = _learner(tmp_path, "loud", "raise RuntimeError('x' * 5_000_000)\n")
    result = grade(EX, path, seed=1, save=False)
    assert not result.ok and "RuntimeError" in result.cases[0].message
    assert all(len(c.message) <= TEXT_LIMIT for c in result.cases)
    assert len(str(result)) < 5 * TEXT_LIMIT
    assert len(json.dumps(formats.gradescope(result))) < 5 * TEXT_LIMIT
    assert len(formats.junit({"loud": result})) < 10 * TEXT_LIMIT


def test_point_shares_add_up_to_the_weight() -> None:
    from judge.grade import point_shares

    for weight, n in ((1.0, 3), (2.0, 7), (0.5, 6), (3.0, 1)):
        shares = point_shares(weight, n)
        assert len(shares) == n and round(sum(shares), 6) == weight and all(s > 0 for s in shares)
    result = grade(EX, SOLUTION, seed=1, save=False)
    data = formats.gradescope(result)
    assert round(sum(t["score"] for t in data["tests"]), 6) == data["score"] == result.max_points
    assert all(len(repr(t["score"])) <= 8 for t in data["tests"])  # never 0.33333333333


HIDDEN = """from judge.api import Obs, case


@case("hidden: a request of 3 tokens")
def three(obs: Obs) -> None:
    import torch
    from minisgl.core import Req, SamplingParams
    from minisgl.kvcache import BaseCacheHandle

    req = Req(torch.arange(3, dtype=torch.int32), 0, 0, 0, SamplingParams(max_tokens=2), BaseCacheHandle(0))
    obs.eq("extend_len", req.extend_len)
"""


def test_gradescope_names_neither_the_count_nor_the_folder_of_hidden_cases(tmp_path: Path) -> None:
    cases_dir = tmp_path / "instructor-secret-folder"
    (cases_dir / EX).mkdir(parents=True)
    (cases_dir / EX / "cases.py").write_text(HIDDEN)
    result = grade(EX, SOLUTION, seed=1, save=False, cases_dir=cases_dir)
    assert result.ok and len(result.part(True)) == 1, str(result)
    shown = formats.gradescope(result)["output"]  # always visible to the learner
    assert "hidden" not in shown.lower() and str(cases_dir) not in shown, shown
    assert str(cases_dir) in str(result)  # the instructor's terminal says where they came from
    told = formats.gradescope(result, hidden_visibility="visible")["output"]
    assert "hidden cases: 1/1 pass" in told


def test_hidden_cases_constants_never_reach_a_public_verdict(tmp_path: Path) -> None:
    # the graded code looks through its process's modules for the hidden cases' globals and
    # raises them in a public case, whose verdict learners see at once
    secret = f"s3cret-{time.monotonic_ns()}"
    cases_dir = tmp_path / "instructor"
    (cases_dir / EX).mkdir(parents=True)
    (cases_dir / EX / "cases.py").write_text(f"SECRET = {secret!r}\n" + HIDDEN)
    path = tmp_path / "snoop.py"
    path.write_text(SOLUTION.read_text().replace(BODY, """        import sys
        for _m in list(sys.modules.values()):
            if isinstance(getattr(_m, "SECRET", None), str):
                raise RuntimeError("found " + _m.SECRET)
""" + BODY))
    result = grade(EX, path, seed=1, save=False, cases_dir=cases_dir)
    public = result.part(False)
    assert public and all(secret not in c.message for c in public), str(result)
    assert len(result.part(True)) == 1


def test_several_answers_in_a_folder_warn_and_a_started_one_wins(tmp_path: Path) -> None:
    from judge import submission

    folder = tmp_path / "ada"
    folder.mkdir()
    (folder / f"{EX}.py").write_text((registry.folder(EX) / "starter.py").read_text())  # never touched
    notebook = {"cells": [{"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                           "source": [f"%%judge {EX}\n", SOLUTION.read_text()]}], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (folder / "10_chunked_prefill.ipynb").write_text(json.dumps(notebook))
    sub = submission.find(folder, EX)
    assert sub.path is not None and sub.path.name == "10_chunked_prefill.ipynb"
    assert sub.warnings and f"{EX}.py" in sub.warnings[0] and "untouched" in sub.warnings[0]
    # a scratch notebook with an answer of its own comes after a chapter's
    (folder / f"{EX}.py").unlink()
    (folder / "Untitled.ipynb").write_text(json.dumps(dict(notebook, cells=[dict(notebook["cells"][0], source=[f"%%judge {EX}\n", WRONG.read_text()])])))
    sub = submission.find(folder, EX)
    assert sub.path.name == "10_chunked_prefill.ipynb" and "Untitled.ipynb" in sub.warnings[0], sub.warnings
    alone = tmp_path / "bob"
    alone.mkdir()
    (alone / f"{EX}.py").write_text(SOLUTION.read_text())
    assert submission.find(alone, EX).warnings == []


# ---- a class on Gradescope ---------------------------------------------------------------------------
FORGED = {"score": 100.0, "output": "forged", "tests": []}


def _run_autograder(root: Path, exercise: str = EX) -> dict:
    import subprocess
    import sys

    env = dict(os.environ, EXERCISE=exercise, AUTOGRADER_ROOT=str(root), WORKBOOK=str(REPO),
               PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    env.pop("SEED", None)
    proc = subprocess.run(["bash", str(REPO / "judge" / "autograder" / "run_autograder")], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((root / "results" / "results.json").read_text())


def test_run_autograder_writes_results_json_itself(tmp_path: Path) -> None:
    # a wrong answer that writes full marks wherever results may go, then goes for the judge
    root = tmp_path / "autograder"
    (root / "submission").mkdir(parents=True)
    results = root / "results"
    (root / "submission" / f"{EX}.py").write_text(f"""import glob as _glob, json as _json, os as _os, signal as _signal
for _d in [{str(results)!r}] + _glob.glob("/tmp/tmp.*"):
    try:
        _os.makedirs(_d, exist_ok=True)
        open(_os.path.join(_d, "results.json"), "w").write(_json.dumps({FORGED!r}))
    except OSError:
        pass
try:
    _os.kill(int(_os.environ["MINISGL_JUDGE_PROCESS"]), _signal.SIGKILL)
except OSError:
    pass
""" + WRONG.read_text())
    first = _run_autograder(root)
    assert first != FORGED
    if confinement.missing():  # the judge refuses, or the kill may land: an error result, never the file the submission wrote
        assert first["tests"] or "could not grade" in first["output"], first
        return
    assert first["tests"] and 0 < first["score"] < sum(t["max_score"] for t in first["tests"]), first
    # one seed per assignment (drawn from the exercise id): a regrade meets the same cases, and scores the same
    import subprocess

    seed = int(subprocess.run(["sh", "-c", f"printf %s {EX} | cksum"], capture_output=True, text=True).stdout.split()[0])
    again = grade(EX, WRONG, seed=seed, save=False)
    assert [t["name"] for t in first["tests"]] == [t["name"] for t in formats.gradescope(again)["tests"]]
    assert first["score"] == again.points
    # the judge gives no verdict (here: an exercise it does not know): an error result, never the file found there
    results.joinpath("results.json").write_text(json.dumps(FORGED))
    died = _run_autograder(root, exercise="no-such-exercise")
    assert died["score"] == 0 and died["tests"] == [] and "could not grade" in died["output"], died


# ---- a class with grade-all ---------------------------------------------------------------------------
def _class(tmp_path: Path, files: dict) -> Path:
    subs = tmp_path / "submissions"
    for learner, text in files.items():
        (subs / learner).mkdir(parents=True)
        (subs / learner / f"{EX}.py").write_text(text)
    return subs


@requires("files")
def test_learners_cannot_reach_each_other(tmp_path: Path) -> None:
    # the first learner graded goes for the class folder, the judge's private copies and the
    # folders the judge would make next; a correct classmate must still pass, unread
    from judge.batch import grade_all

    leak = tmp_path / "leak"
    leak.write_text("not run")  # made here: a folder that holds a closed one takes no new files from the graded code
    subs = tmp_path / "submissions"
    wrong = WRONG.read_text()
    evil = f"""import glob as _glob, os as _os
_got = []
_here = _os.path.dirname(_os.path.abspath(__file__))
for _f in _glob.glob({str(subs)!r} + "/*/*.py") + _glob.glob(_os.path.dirname(_here) + "/*/*.py"):
    if _os.path.dirname(_os.path.abspath(_f)) == _here:
        continue
    try:
        _got.append(open(_f).read()[:10])
        open(_f, "w").write({wrong!r})
    except OSError:
        pass
for _name in ("b-good", "c-good"):
    for _d in (_os.path.dirname(_here), {str(subs)!r}, {str(tmp_path / "grades")!r}):
        try:
            _os.makedirs(_os.path.join(_d, _name, "planted"))
            _got.append(_d)
        except OSError:
            pass
open({str(leak)!r}, "w").write(repr(_got))
"""
    subs = _class(tmp_path, {"a-evil": evil + wrong, "b-good": SOLUTION.read_text(), "c-good": SOLUTION.read_text()})
    before = {p: p.read_bytes() for p in subs.rglob("*.py")}
    batch = grade_all(subs, EX, out=tmp_path / "grades", jobs=1, seed=1, echo=lambda _: None, allow_weaker_sandbox=True)
    results = {g.learner: g.result for g in batch.learners}
    assert results["b-good"].ok and results["c-good"].ok, str(results["b-good"]) + str(results["c-good"])
    assert leak.read_text() == "[]"
    assert {p: p.read_bytes() for p in subs.rglob("*.py")} == before


def test_the_progress_bar_fits_80_columns() -> None:
    import io

    from judge.batch import Bar

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Tty()
    bar = Bar(120, stream)
    for i in range(120):
        bar.step(f"learner-with-a-rather-long-name-{i}: 11/11 and then some words that go on and on")
    assert max(len(line) for line in stream.getvalue().replace("\n", "\r").split("\r")) <= 80


def test_grade_all_keeps_what_it_graded_through_ctrl_c_and_resumes(tmp_path: Path) -> None:
    import csv
    import subprocess
    import sys

    from judge.batch import grade_all

    flag = tmp_path / "hang"  # while it exists, the later learners' answers loop for ever
    flag.write_text("")
    hang = SOLUTION.read_text().replace(BODY, f"        import os\n        while os.path.exists({str(flag)!r}):\n            pass\n" + BODY)
    subs = _class(tmp_path, {"ada": SOLUTION.read_text(), "bob": hang, "cy": hang})
    roster = tmp_path / "roster.txt"
    roster.write_text("learner\nada\nbob\ncy\nzed\n")  # zed handed nothing in
    out = tmp_path / "grades"
    proc = subprocess.Popen([sys.executable, "judge.py", "grade-all", str(subs), "--exercise", EX, "--jobs", "1", "--seed", "5",
                             "--roster", str(roster), "--out", str(out), confinement.FLAG], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            # as from a terminal: a test worker may run with SIGINT ignored, which a child inherits
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 120
        while not (out / "learners" / "ada.learner.json").exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert (out / "learners" / "ada.learner.json").exists(), proc.communicate(timeout=5)[0][-3000:]  # recorded as she finished
        time.sleep(3.0)  # bob's worker is started and looping now (a Ctrl-C while it starts is not this test's case)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        text = proc.communicate(timeout=30)[0]
        assert time.monotonic() - t0 < 10 and proc.returncode == 130, text[-3000:]
    finally:
        proc.kill()
    totals = {r["learner"]: r for r in csv.DictReader(open(out / "totals.csv"))}
    assert list(totals) == ["ada", "bob", "cy", "zed"], totals
    assert totals["ada"]["verdict"] == "graded" and float(totals["ada"]["points"]) == float(totals["ada"]["max_points"])
    assert totals["bob"]["verdict"] == totals["cy"]["verdict"] == "not graded" and totals["zed"]["verdict"] == "missing"
    flag.unlink()
    batch = grade_all(subs, EX, out=out, jobs=1, resume=True, roster=["ada", "bob", "cy", "zed"], echo=lambda _: None,
                      allow_weaker_sandbox=True)
    by = {g.learner: g for g in batch.learners}
    assert batch.seed == 5 and all(by[n].result.ok for n in ("ada", "bob", "cy")) and by["zed"].verdict == "missing"
    assert by["ada"].seconds == json.loads((out / "learners" / "ada.learner.json").read_text())["seconds"]  # not graded again


def test_the_judge_replaces_a_planted_link_instead_of_writing_through_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # where the graded code could write (no Landlock), it may swap the progress record for a link
    from judge import progress

    state = tmp_path / "state"
    state.mkdir()
    monkeypatch.setattr(registry, "STATE_DIR", state)
    before = b'{"req-lengths": {"passed": 1, "total": 8, "file": "x", "when": "then"}}'
    progress.path().write_bytes(before)
    victim = tmp_path / "victim"
    victim.write_text("the judge must not write here")
    progress.path().unlink()
    progress.path().symlink_to(victim)
    assert progress.restore(before)
    assert victim.read_text() == "the judge must not write here"
    assert not progress.path().is_symlink() and progress.path().read_bytes() == before


class _CgroupV2:
    """A cgroup v2 folder as the kernel keeps it: `+pids` is refused while processes sit in the
    cgroup itself (the no-internal-processes rule); a pid written to a child's procs moves there."""

    def __init__(self, root: Path, procs: list) -> None:
        self.root, self.procs = root, {root: list(procs)}
        self.control = {root: []}

    def read(self, path: Path) -> str:
        if path.name == "cgroup.procs":
            return "\n".join(self.procs[path.parent])
        if path.name == "cgroup.controllers":
            return "cpu memory pids"
        return " ".join(self.control[path.parent])

    def write(self, path: Path, text: str) -> None:
        if path.name == "cgroup.subtree_control":
            if self.procs[path.parent]:
                raise OSError(16, "Device or resource busy")
            self.control[path.parent].append(text.lstrip("+"))
        else:  # cgroup.procs: one pid moves in
            for procs in self.procs.values():
                if text in procs:
                    procs.remove(text)
            self.procs[path.parent].append(text)

    def mkdir(self, path: Path) -> None:
        self.procs.setdefault(path, [])


def test_in_a_container_whose_cgroup_holds_its_processes_the_judge_still_caps_forks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Gradescope's and docker's containers start with every process in the namespace's root cgroup
    fake = _CgroupV2(tmp_path, ["1", "17", "42"])
    for name in ("read", "write", "mkdir"):
        monkeypatch.setattr(cgroups, "_" + name, getattr(fake, name))
    cgroups._delegate_pids(tmp_path, container_root=True)
    assert fake.control[tmp_path] == ["pids"]
    assert fake.procs[tmp_path] == [] and sorted(fake.procs[tmp_path / cgroups.LEAF]) == ["1", "17", "42"]
    # outside a container's root (a systemd scope, say) the judge moves nobody's processes
    other = _CgroupV2(tmp_path, ["1", "17"])
    for name in ("read", "write", "mkdir"):
        monkeypatch.setattr(cgroups, "_" + name, getattr(other, name))
    with pytest.raises(OSError):
        cgroups._delegate_pids(tmp_path, container_root=False)
    assert other.procs == {tmp_path: ["1", "17"]}
