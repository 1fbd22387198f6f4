"""The grading subprocess: install a learner's piece (or none, for the reference), run cases,
write one JSON line per event. The parent (`runner.py`) enforces time and memory limits, so a
learner's crash, endless loop or memory blow-up ends this process, never the judge.

    python -m judge.worker JOB.json
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import platform
import stat
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Dict, List, TextIO


def _version_of(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "absent"


def fingerprint() -> Dict[str, str]:
    """What the outputs may depend on: the device kind, torch and transformers versions."""
    import torch

    if torch.cuda.is_available():
        device = f"cuda ({torch.cuda.get_device_name(0)})"
    else:
        device = "cpu"
    return {
        "device": device,
        "torch": torch.__version__,
        "transformers": _version_of("transformers"),  # importing it would cost a second per worker
        "python": platform.python_version_tuple()[0] + "." + platform.python_version_tuple()[1],
    }


def format_error(exc: BaseException, learner_file: str | None) -> str:
    """The exception and the frames that matter: the learner's lines first, then where it broke."""
    if isinstance(exc, SyntaxError) and exc.filename and learner_file and os.path.abspath(exc.filename) == learner_file:
        return f"SyntaxError: {exc.msg}\n  your file, line {exc.lineno}: {(exc.text or '').strip()}"
    frames = traceback.extract_tb(exc.__traceback__)
    lines = []
    mine = [f for f in frames if learner_file and os.path.abspath(f.filename) == learner_file]
    for f in mine[-3:]:
        lines.append(f"  your file, line {f.lineno}, in {f.name}: {(f.line or '').strip()}")
    if frames and (not mine or frames[-1] is not mine[-1]):
        f = frames[-1]
        where = os.path.relpath(f.filename) if not f.filename.startswith("<") else f.filename
        lines.append(f"  raised in {where}, line {f.lineno}, in {f.name}: {(f.line or '').strip()}")
    msg = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, RecursionError):
        msg += " (does a method call itself, e.g. through super() or the engine class?)"
    return msg + ("\n" + "\n".join(lines) if lines else "")


def _failure_kind(exc: BaseException) -> str:
    """How a run failed, in the worker's words ("rejected", "oom", "error"): the parent turns it
    into a verdict, and no word of this process's ever becomes a pass."""
    if type(exc).__name__ == "ReferenceUsedError":
        return "rejected"
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError" or "can't allocate memory" in str(exc):
        return "oom"
    return "error"


def _tail(text: str, limit: int = 1500) -> str:
    return text if len(text) <= limit else "...\n" + text[-limit:]


def _emit(out: TextIO, **event: Any) -> None:
    out.write(json.dumps(event, default=str) + "\n")
    out.flush()


def _run_case(case, item: Dict[str, Any], obs) -> None:
    import torch

    torch.manual_seed(0)
    if case.seeds:
        case.fn(obs, item["seed"])
    else:
        case.fn(obs)


def _git_dirs(repo: Path) -> List[Path]:
    """The repository's git folders: `.git`, and where a worktree's `.git` file points (its own
    folder and the shared one, which holds the objects)."""
    dot = repo / ".git"
    out = [dot]
    if dot.is_file():
        text = dot.read_text(errors="replace").strip()
        if text.startswith("gitdir:"):
            own = (repo / text[len("gitdir:"):].strip()).resolve()
            out.append(own)
            common = own / "commondir"
            if common.is_file():
                out.append((own / common.read_text().strip()).resolve())
    return out


def _devices() -> List[Path]:
    """The block devices in /dev: read raw, a disk holds every file on it."""
    out = []
    try:
        for entry in os.scandir("/dev"):
            try:
                if stat.S_ISBLK(entry.stat(follow_symlinks=False).st_mode):
                    out.append(Path(entry.path))
            except OSError:
                continue
    except OSError:
        pass
    return out


def _open_gpu() -> None:
    """Set up CUDA before the learner's code is confined. The driver's first call opens and
    configures the GPU's device files in ways the confinement refuses (a confined first call fails,
    and the code would run on the CPU); the context it leaves open keeps working afterwards. The
    grading must run where the reference runs: without the GPU, there is no verdict."""
    import torch

    try:
        torch.cuda.init()
        torch.zeros(1, device="cuda").add_(1)
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - any failure means no GPU for this grading
        raise RuntimeError(f"the judge grades on the GPU here, but its grading process could not open it ({exc}); "
                           "the grading did not run: check that this process can use CUDA "
                           "(`python -c \"import torch; torch.zeros(1, device='cuda')\"`)") from exc


def _check_gpu_kept() -> None:
    """The GPU opened before confinement is still usable under it (else the cases would quietly run
    on the CPU and be compared with the reference's GPU outputs)."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("the judge grades on the GPU here, but the confined grading process cannot reach it "
                           "(torch.cuda.is_available() is False under the sandbox); the grading did not run: "
                           "see `python judge.py sandbox` and the README's section on the judge's sandbox")


def _confine(job: Dict[str, Any], learner_file: str) -> None:
    """From here on, this process (the learner's code) cannot read the recorded references, git's
    objects, the judge's state, its private folder (but for this job's scratch folder) or the
    hidden cases, nor write the repository, nor signal a process outside its sandbox
    (`judge.sandbox`), nor change any file's permissions, times or attributes (`judge.seccomp`)."""
    from judge import namespaces, privileges, registry, sandbox, seccomp

    # what the judge counts on here (`judge.confinement`): each one asked for must hold, or the
    # learner's code does not run at all
    wanted = job.get("confine") or {}
    refused = os.environ.get(namespaces.REFUSED)
    if wanted.get("namespaces") and refused:
        raise RuntimeError(f"the judge could not isolate the grading process: {refused}")
    # temporary files go to the job's own scratch folder, the one place under the judge's private
    # folder it may open: the control files, the reference run and other learners are out of reach
    scratch = Path(job["scratch"])
    os.environ["TMPDIR"] = tempfile.tempdir = str(scratch)
    for cache in (".cache", ".triton"):  # kernel caches (a GPU's JIT) that a confined process could not create in ~
        try:
            (Path.home() / cache).mkdir(exist_ok=True)
        except OSError:
            pass
    repo = Path(job["repo"])
    # git's objects hold every recorded reference too
    no_access = [repo / "judge" / "reference", *_git_dirs(repo), registry.STATE_DIR, Path(job["private"]), *_devices(),
                 *map(Path, job.get("no_access", []))]
    if job.get("cases_dir"):
        no_access.append(Path(job["cases_dir"]))
    # /proc and /sys only read: as root, their files would set the kernel's parameters (or reboot it)
    if wanted.get("landlock"):
        why = sandbox.restrict(no_access, [repo, Path("/proc"), Path("/sys")], [Path(learner_file)], writable=[scratch])
        if why is not None:
            raise RuntimeError(f"the judge could not confine the grading process: {why}")
    why = privileges.drop()  # root's powers beyond files (modules, reboot, raw I/O, mounts)
    if why is not None:
        raise RuntimeError(f"the judge could not drop the grading process's privileges: {why}")
    if wanted.get("seccomp"):
        why = seccomp.forbid_metadata_changes()  # chmod, utime, xattrs: what Landlock does not cover
        if why is not None:
            raise RuntimeError(f"the judge could not confine the grading process: {why}")
    if job.get("use_cuda"):
        _check_gpu_kept()


# The engine as `LLM` and the server compose it. A later chapter's part extends some earlier classes in
# place (`SamplingParams`' request fields): importing it all gives every worker, forked from the fork
# server (which imported it) or started afresh, the same classes and so the same observations.
ENGINE_PACKAGES = ("minisgl.core", "minisgl.kvcache", "minisgl.models", "minisgl.attention", "minisgl.engine",
                   "minisgl.scheduler")


def import_engine() -> None:
    import importlib

    for name in ENGINE_PACKAGES:
        importlib.import_module(name)


def main(job_path: str) -> int:
    job = json.loads(Path(job_path).read_text())
    out = open(job["out"], "a")
    repo = job["repo"]
    if repo not in sys.path:
        sys.path.insert(0, repo)
    import torch

    torch.set_num_threads(max(1, int(job.get("threads", 1))))
    from judge import install, registry
    from judge.api import Obs

    import_engine()  # before the cases and the learner's code, as in a forked worker

    learner_file = os.path.abspath(job["file"]) if job.get("file") else None
    # the cases (and an instructor's hidden ones) are read before any of the learner's code runs
    ex = registry.load(job["exercise"], job.get("cases_dir"))
    installed = None
    if learner_file:
        source = Path(learner_file).read_text()
        try:
            if job.get("use_cuda"):
                _open_gpu()
            _confine(job, learner_file)
        except RuntimeError as exc:
            _emit(out, event="fatal", kind="error", error=str(exc))
            return 0
    try:
        if learner_file:
            findings = install.scan(source, ex.replaces, ex.id)
            if findings:
                _emit(out, event="fatal", kind="rejected", error="your file reaches the engine's own version of the piece it replaces:\n" + "\n".join(f"  {f}" for f in findings))
                return 0
            hidden = install.hide(ex.replaces)
            before = set(sys.modules)
            learner = install.load_learner(Path(learner_file))
            borrowed = install.exercise_files_loaded(set(sys.modules) - before, learner_file)
            if borrowed:
                _emit(out, event="fatal", kind="rejected", error="your file loads the exercise's own files: " + ", ".join(borrowed))
                return 0
            installed = install.transplant(ex.replaces, learner, hidden)
    except install.MissingPieceError as exc:
        _emit(out, event="fatal", kind="error", error=str(exc))
        return 0
    except BaseException as exc:  # the learner's module failed to import
        _emit(out, event="fatal", kind=_failure_kind(exc), error="your file failed to load: " + format_error(exc, learner_file))
        return 0
    _emit(out, event="ready", fingerprint=fingerprint(), skipped=installed.skipped if installed else [])

    by_key = {c.key: c for c in ex.cases}
    if job.get("speed"):
        if installed is None:
            raise ValueError("a timing run needs the learner's file")
        from judge.speed import measure

        _emit(out, event="speed", timings=measure(ex, [(by_key[i["key"]], i) for i in job["cases"]], installed, _run_case))
        return 0
    for item in job["cases"]:
        case = by_key[item["key"]]
        _emit(out, event="start", case=item["id"])
        obs = Obs()
        printed = io.StringIO()  # what the case (the learner's code) prints, shown with its verdict
        t0 = time.perf_counter()
        try:
            with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
                _run_case(case, item, obs)
            outcome, kind, error = "returned", None, ""
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                raise
            outcome, kind, error = "raised", _failure_kind(exc), format_error(exc, learner_file)
        # observations only: whether the case returned, and what it recorded; the verdict is the parent's
        _emit(out, event="done", case=item["id"], outcome=outcome, kind=kind, error=error, obs=obs.items,
              printed=_tail(printed.getvalue()), seconds=time.perf_counter() - t0)
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # do not wait for threads the learner's code may have left running
