"""A process that compiles JSON schemas into xgrammar grammars, so that a slow schema can be
stopped (killed) without stopping anything else.

`CompileChild` is the parent's handle: it starts the process, sends it a schema and waits for the
serialised grammar, giving up when the caller says so (a time limit, a request gone). The process
imports xgrammar once and forks a short-lived process per schema: killing that one stops a compile
in milliseconds and leaves the warm process ready for the next, and whatever a compile allocated
goes when its process exits, so the compiler's size never grows with the schemas it has seen.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import re
import signal
import socket
import subprocess
import sys
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Callable, List, Optional, Tuple

from minisgl.core import InvalidRequestError
from minisgl.env import child_environment

Key = Tuple[str, str]  # (json_mode, schema text): what a compiled grammar depends on
STARTUP_S = 120.0  # the compiling child imports xgrammar and torch (seconds on a busy CPU)
POLL_S = 0.02  # how often a wait for a compile looks at whether it should give up
STOP_S = 5.0  # for the child to say a stopped compile is gone; else the child itself is replaced
QUOTE_CHARS = 40  # of the client's schema, quoted in the compiler's reason
_LOG_PREFIX = re.compile(r"^\s*(\[[\d:]+\]\s*)?\S+\.(cc|cpp|h|hpp|py):\d+:\s*")  # "[16:49:24] /src/x.cc:88: "
_LONG = re.compile(r"(\"[^\"]{%d,}\"|'[^']{%d,}'|\S{%d,})" % ((QUOTE_CHARS,) * 3))


class CompileStopped(Exception):
    """The wait for a compile was given up (`CompileChild.compile`'s `stop` said so); the child is killed."""


def compiler_reason(text: str) -> str:
    """xgrammar's error, fit for a client: its first line, without the log prefix that names the
    compiler's source file, each quote of the schema (or any long word) cut to `QUOTE_CHARS`."""
    line = _LOG_PREFIX.sub("", text.strip().splitlines()[0] if text.strip() else "")
    return _LONG.sub(lambda m: m.group(0)[:QUOTE_CHARS] + "...", line)[:300]


def compile_schema(compiler: Any, key: Key) -> Any:
    """Compile `key` with an xgrammar `GrammarCompiler`; InvalidRequestError if it cannot be used."""
    mode, schema = key
    try:
        # compact JSON: a small model left free to add whitespace may emit it forever
        return compiler.compile_json_schema(schema, any_whitespace=False, strict_mode=mode == "schema")
    except (RuntimeError, ValueError, TypeError) as e:
        reason = compiler_reason(str(e))
        raise InvalidRequestError(f"json_schema cannot be used to constrain decoding: {reason}") from None


class CompileChild:
    """One compiling process, started on first use and again after it was killed."""

    def __init__(self) -> None:
        self._proc: Optional[subprocess.Popen] = None
        self._conn: Optional[Connection] = None
        self.up = False  # started and ready for a schema
        self.compile_pid: Optional[int] = None  # the process compiling a schema now

    @property
    def pid(self) -> Optional[int]:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def start(self, tokenizer_info: Any) -> None:
        """Start the process unless it runs (RuntimeError if it does not start within STARTUP_S)."""
        if self.pid is not None:
            return
        self.stop()
        ours, theirs = socket.socketpair()
        main = f"from minisgl.engine.grammar_child import child_main; child_main({theirs.fileno()})"
        cmd = [sys.executable, "-c", main]
        env = child_environment(Path(__file__).resolve().parents[2])  # this copy of minisgl, wherever it runs from
        self._proc = subprocess.Popen(cmd, pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, env=env)
        theirs.close()
        self._conn = Connection(ours.detach())
        self._conn.send(tokenizer_info.serialize_json())
        if not self._conn.poll(STARTUP_S) or self._conn.recv() != ("ready", None):
            self.stop()
            raise RuntimeError(f"the grammar compiler process did not start within {STARTUP_S:g} s")
        self.up = True

    def compile(self, key: Key, tokenizer_info: Any, stop: Callable[[], Optional[Exception]]) -> str:
        """The serialised grammar of `key`. `stop()` is asked every POLL_S: an exception it returns
        ends the compile (its process is killed) and is raised. InvalidRequestError if xgrammar
        refuses the schema."""
        self.start(tokenizer_info)
        try:
            self._conn.send(key)
            _, self.compile_pid = self._answer(stop, None)  # ("pid", the process compiling it), sent as it starts
            status, payload = self._answer(stop, self.compile_pid)
        except (EOFError, OSError):
            self.stop()
            raise InvalidRequestError("json_schema cannot be used to constrain decoding: its compilation "
                                      "failed") from None
        finally:
            self.compile_pid = None
        if status != "ok":
            raise InvalidRequestError(payload if status == "error" else "json_schema cannot be used to constrain "
                                                                        "decoding: its compilation failed")
        return payload

    def _answer(self, stop: Callable[[], Optional[Exception]], pid: Optional[int]) -> Tuple[str, Any]:
        """The child's next message, unless `stop()` says to give up first: then the compile `pid`
        is killed (the child then says so, which keeps the channel in step), or the whole child
        if there is no compile to kill yet."""
        while not self._conn.poll(POLL_S):
            reason = stop()
            if reason is None:
                continue
            if pid is not None:  # the child kills it if it still runs: only it knows the pid is not reused yet
                os.kill(self._proc.pid, signal.SIGUSR1)
            if pid is None or not self._conn.poll(STOP_S):
                self.stop()
            else:
                self._conn.recv()
            raise reason
        return self._conn.recv()

    def stop(self) -> None:
        self.up = False
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _die_with_parent() -> None:
    try:  # Linux: killed with the parent even if that is SIGKILLed
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def child_main(fd: int) -> None:
    """The compiling child: it receives the vocabulary once, then for each schema it is sent forks
    a process that compiles it, says ("pid", its pid), and then ("ok", the serialised grammar),
    ("error", why) or ("killed", None). SIGUSR1 kills the compile running, if any, and leaves this
    process warm for the next. It ends with its parent."""
    _die_with_parent()
    os.nice(10)  # the scheduler's steps come first
    import xgrammar as xgr

    conn = Connection(fd)
    compiling: List[Optional[int]] = [None]  # the forked process, until it is reaped
    signal.signal(signal.SIGUSR1, lambda *_: compiling[0] is not None and os.kill(compiling[0], signal.SIGKILL))
    try:
        info = xgr.TokenizerInfo.deserialize_json(conn.recv())
        conn.send(("ready", None))
        while True:
            key = conn.recv()
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:
                signal.signal(signal.SIGUSR1, signal.SIG_DFL)
                conn.close()
                os.close(read)
                _compile_then_exit(info, key, write)
            compiling[0] = pid
            os.close(write)
            conn.send(("pid", pid))
            with os.fdopen(read, "rb") as f:
                answer = f.read()
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})  # no kill once its pid may be reused
            _, status = os.waitpid(pid, 0)
            compiling[0] = None
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
            conn.send(pickle.loads(answer) if status == 0 and answer else ("killed", None))
    except (EOFError, OSError):
        pass  # the scheduler is gone (maybe mid-message)


def _compile_then_exit(info: Any, key: Key, fd: int) -> None:
    """The forked process: compile `key`, write the pickled answer to `fd`, exit (its memory goes with it)."""
    import xgrammar as xgr

    _die_with_parent()
    code = 1
    try:
        compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)  # the scheduler caches
        try:
            answer = ("ok", compile_schema(compiler, key).serialize_json())
        except InvalidRequestError as e:
            answer = ("error", str(e))
        with os.fdopen(fd, "wb") as f:
            pickle.dump(answer, f, protocol=pickle.HIGHEST_PROTOCOL)
        code = 0
    except BaseException:  # printed here: os._exit skips the interpreter's own report
        traceback.print_exc()
    finally:  # never back into the parent's loop, whatever happened
        os._exit(code)
