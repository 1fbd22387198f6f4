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

import pytest

from judge import formats, grade, registry, sandbox, scratch, variants
from judge.compare import first_difference
from judge.result import TEXT_LIMIT

REPO = Path(__file__).resolve().parent.parent
EX = "req-lengths"
SOLUTION = variants.solution_file(EX)
WRONG = variants.variant_file(EX, variants.declared(EX)[0].name)
BODY = "        return self.device_len - self.cached_len"  # Req.extend_len in the answer

needs_landlock = pytest.mark.skipif(not sandbox.available(), reason="this kernel has no Landlock: the judge says it cannot confine")
needs_scoping = pytest.mark.skipif(not sandbox.scopes_signals(), reason="this kernel's Landlock cannot scope signals (ABI < 6)")


def _learner(tmp_path: Path, name: str, prefix: str, source: Path = SOLUTION) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(prefix + source.read_text())
    return path


# ---- reading what grades it ----------------------------------------------------------------------
@needs_landlock
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
@needs_landlock
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


@pytest.mark.skipif(sandbox.abi_version() < 4, reason="this kernel's Landlock cannot restrict TCP (ABI < 4)")
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


@needs_landlock
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
@needs_scoping
def test_signals_reach_no_process_outside_the_worker(tmp_path: Path) -> None:
    # signal 0 asks the kernel whether a signal would be delivered, and delivers none
    leak = tmp_path / "leak"
    path = _learner(tmp_path, "signals", f"""import os as _os
def _parent(pid):
    _stat = open(f"/proc/{{pid}}/stat").read()
    return int(_stat[_stat.rindex(")") + 2:].split()[1])
_keeper = _os.getppid()
_reached = []
for _pid in (_keeper, _parent(_keeper), int(_os.environ["MINISGL_JUDGE_PROCESS"])):
    try:
        _os.kill(_pid, 0)
        _reached.append(_pid)
    except OSError:
        pass
open({str(leak)!r}, "w").write(" ".join(map(str, _reached)))
""")
    assert grade(EX, path, seed=1, save=False).ok
    assert leak.read_text() == ""  # not the keeper, not the fork server, not the judge


def test_a_stopped_fork_server_costs_no_time() -> None:
    # where signals are not scoped, graded code can SIGSTOP the fork server; here the test does it
    from judge import runner

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
    if not sandbox.scopes_signals():  # the kill may land: then an error result, never the file the submission wrote
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


@needs_landlock
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
    batch = grade_all(subs, EX, out=tmp_path / "grades", jobs=1, seed=1, echo=lambda _: None)
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
                             "--roster", str(roster), "--out", str(out)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
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
    batch = grade_all(subs, EX, out=out, jobs=1, resume=True, roster=["ada", "bob", "cy", "zed"], echo=lambda _: None)
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
