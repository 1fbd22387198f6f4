"""Start the server's processes, wait until each is ready, and take them all down together.

    API server (this process) --ipc--> tokenizer worker --ipc--> scheduler (the engine)
              ^------------------------------ipc-----------------'  (tokens come back the same way)

Every process receives on a socket it binds and sends on sockets it connects to, so start-up
order does not matter for ZMQ. We still start the scheduler first: the tokenizer worker needs its
context length, and the API should not accept requests before the model is loaded.

No orphans: children ignore Ctrl-C (the terminal sends it to the whole group; the parent decides),
ask the kernel to SIGTERM them if the parent dies, and also notice a changed parent pid when idle.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import shutil
import signal
import tempfile
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, List

from .args import ServerArgs


@dataclass(frozen=True)
class Addresses:
    api_to_tokenizer: str
    tokenizer_to_api: str
    tokenizer_to_scheduler: str
    scheduler_to_tokenizer: str

    @staticmethod
    def in_folder(folder: str) -> "Addresses":
        return Addresses(*(f"ipc://{folder}/{name}" for name in ("api_to_tok", "tok_to_api", "tok_to_sched",
                                                                 "sched_to_tok")))


class LaunchError(RuntimeError):
    pass


def _child_setup() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:  # Linux: die with the parent even if it is SIGKILLed
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _name_process(title: str) -> None:
    """Set the name `ps`, `top` and /proc/PID/comm show (at most 15 bytes), so an operator -- or
    a test -- can tell the scheduler from the tokenizer worker."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(15, title.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except OSError:
        pass


def _run_scheduler(args: ServerArgs, addrs: Addresses, parent_pid: int, ready: Connection) -> None:
    _child_setup()
    _name_process("minisgl-sched")
    try:
        from minisgl.scheduler.io import SchedulerIO  # here: the API process has no use for the engine

        from minisgl.engine.grammar import AsideCompiler, CompileLimits

        sched = SchedulerIO(args.scheduler, addrs.tokenizer_to_scheduler, addrs.scheduler_to_tokenizer)
        # JSON schemas compile beside the loop, so one slow schema never stalls the other streams
        limits = CompileLimits(args.server.grammar_timeout_s, args.server.max_schema_bytes)
        sched.grammar.aside = AsideCompiler(sched.grammar, limits)
    except Exception as e:  # reported to the parent, which prints it and exits
        ready.send(("error", f"{type(e).__name__}: {e}"))
        raise
    device = str(sched.device) + (f", tensor parallel over {args.engine.tp_size} "
                                  "ranks" if args.engine.tp_size > 1 else "")
    ready.send(("ok", {"max_seq_len": sched.max_seq_len, "num_pages": sched.cache.num_pages, "device": device}))
    sched.run_forever(parent_pid)


def _run_tokenizer(args: ServerArgs, addrs: Addresses, max_seq_len: int, parent_pid: int, ready: Connection) -> None:
    _child_setup()
    _name_process("minisgl-token")
    try:
        from transformers import AutoTokenizer  # here too: only the worker tokenizes

        from minisgl.tokenizer.worker import TokenizerWorker
        from minisgl.utils.mp import ZmqPullQueue, ZmqPushQueue

        from_api = ZmqPullQueue(addrs.api_to_tokenizer, bind=True)
        from_sched = ZmqPullQueue(addrs.scheduler_to_tokenizer, bind=True)
        worker = TokenizerWorker(
            AutoTokenizer.from_pretrained(args.tokenizer_path),
            max_seq_len,
            ZmqPushQueue(addrs.tokenizer_to_scheduler, bind=False),
            ZmqPushQueue(addrs.tokenizer_to_api, bind=False),
        )
    except Exception as e:
        ready.send(("error", f"{type(e).__name__}: {e}"))
        raise
    ready.send(("ok", {}))
    worker.run(from_api, from_sched, parent_pid)


class Backend:
    """The scheduler and tokenizer processes. Use as a context manager: leaving it stops them."""

    def __init__(self, args: ServerArgs, timeout_s: float = 600.0):
        self.args = args
        self.folder = tempfile.mkdtemp(prefix="minisgl-")
        self.addrs = Addresses.in_folder(self.folder)
        self.procs: List[mp.Process] = []
        self.timeout_s = timeout_s
        self.info: dict = {}

    def _start(self, name: str, target: Any, *args: Any) -> dict:
        ctx = mp.get_context("spawn")  # never fork a process that may hold CUDA or threads
        parent, child = ctx.Pipe(duplex=False)
        # a scheduler leading tensor-parallel ranks starts processes of its own, which a daemonic
        # process may not; it still dies with us (see _child_setup)
        daemon = not (name == "scheduler" and self.args.engine.tp_size > 1)
        proc = ctx.Process(target=target, args=(*args, child), name=f"minisgl-{name}", daemon=daemon)
        proc.start()
        self.procs.append(proc)
        child.close()
        if not parent.poll(self.timeout_s):
            raise LaunchError(f"the {name} process did not start within {self.timeout_s} s")
        try:
            status, payload = parent.recv()
        except EOFError:
            raise LaunchError(f"the {name} process died while starting (exit code {proc.exitcode}); see its output "
                              "above") from None
        if status != "ok":
            raise LaunchError(f"the {name} process failed to start: {payload}")
        return payload

    def __enter__(self) -> "Backend":
        try:
            pid = os.getpid()
            self.info = self._start("scheduler", _run_scheduler, self.args, self.addrs, pid)
            self._start("tokenizer", _run_tokenizer, self.args, self.addrs, self.info["max_seq_len"], pid)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def dead(self) -> List[str]:
        """The processes that have exited, with their exit codes (negative: killed by a signal)."""
        return [f"{p.name} exited with {p.exitcode}" for p in self.procs if not p.is_alive()]

    def stop(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.terminate()
        for p in self.procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join(5)
        self.procs = []
        shutil.rmtree(self.folder, ignore_errors=True)
