"""Start the server's processes, wait until each is ready, and take them all down together.

    API server (this process) --ipc--> tokenizer worker --ipc--> scheduler (the engine)
              ^------------------------------ipc-----------------'  (tokens come back the same way)

Every process receives on a socket it binds and sends on sockets it connects to, so start-up
order does not matter for ZMQ. Both start at once: the tokenizer worker loads its tokenizer while
the scheduler loads the model, then waits for the context length the scheduler reports. Start-up
can take long (loading the model; on a GPU, the engine's preparation steps), so it never blocks
the caller's loop: `Backend.starting` yields while it waits, and says what it waits for
(`waiting_for`), which the HTTP server reports at `/health` meanwhile.

No orphans: children ignore Ctrl-C (the terminal sends it to the whole group; the parent decides),
ask the kernel to SIGTERM them if the parent dies, and also notice a changed parent pid when idle.
"""

from __future__ import annotations

import asyncio
import ctypes
import multiprocessing as mp
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Callable, Generator, Iterator, List, Optional, Tuple

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


POLL_S = 0.05  # how often a start-up in progress looks at its children's pipes


class LaunchError(RuntimeError):
    pass


def say(line: str) -> None:
    """A line for the operator's terminal, beside the engine's own (stderr, unbuffered)."""
    print(f"minisgl: {line}", file=sys.stderr, flush=True)


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
        ready.send(("waiting", _loading(args)))
        from minisgl.scheduler.io import SchedulerIO  # here: the API process has no use for the engine

        from minisgl.engine.grammar import AsideCompiler, CompileLimits

        sched = SchedulerIO(args.scheduler, addrs.tokenizer_to_scheduler, addrs.scheduler_to_tokenizer)
        # JSON schemas compile beside the loop, so one slow schema never stalls the other streams
        limits = CompileLimits(args.server.grammar_timeout_s, args.server.max_schema_bytes)
        sched.grammar.aside = AsideCompiler(sched.grammar, limits)
        sched.grammar.cache_bytes = args.server.grammar_cache_mb * 1024 * 1024
        sched.grammar.keep_wire = args.engine.tp_size > 1  # the other ranks get each grammar compiled
    except Exception as e:  # reported to the parent, which prints it and exits
        ready.send(("error", f"{type(e).__name__}: {e}"))
        raise
    device = str(sched.device) + (f", tensor parallel over {args.engine.tp_size} "
                                  "ranks" if args.engine.tp_size > 1 else "")
    ready.send(("ok", {"max_seq_len": sched.max_seq_len, "num_pages": sched.cache.num_pages, "device": device}))
    sched.run_forever(parent_pid)


def _loading(args: ServerArgs) -> str:
    """What the scheduler's start-up does, as /health and the shell say it."""
    device = args.engine.torch_device  # resolves "auto" here, in the process that will use the device
    what = f"the scheduler to load {args.model_name} onto {device}"
    if device.type == "cuda":
        # importing the engine's package imports the modules that register what a GPU engine prepares
        from minisgl.engine.engine import gpu_preparation

        doing = gpu_preparation(args.engine)
        what += (", then " + " and ".join(doing)) if doing else ""
    return what


def _run_tokenizer(args: ServerArgs, addrs: Addresses, parent_pid: int, ready: Connection) -> None:
    _child_setup()
    _name_process("minisgl-token")
    try:
        from minisgl.tokenizer.worker import TokenizerWorker  # here too: only the worker tokenizes
        from minisgl.utils.mp import ZmqPullQueue, ZmqPushQueue
        from minisgl.utils.tokenizer import has_chat_template

        tokenizer = _server_tokenizer(args)
        ready.send(("loaded", None))
        max_seq_len = ready.recv()  # the scheduler's, once it has loaded the model
        from_api = ZmqPullQueue(addrs.api_to_tokenizer, bind=True)
        from_sched = ZmqPullQueue(addrs.scheduler_to_tokenizer, bind=True)
        worker = TokenizerWorker(
            tokenizer,
            max_seq_len,
            ZmqPushQueue(addrs.tokenizer_to_scheduler, bind=False),
            ZmqPushQueue(addrs.tokenizer_to_api, bind=False),
        )
    except Exception as e:
        ready.send(("error", f"{type(e).__name__}: {e}"))
        raise
    ready.send(("ok", {"chat_template": has_chat_template(tokenizer)}))
    worker.run(from_api, from_sched, parent_pid)


def _server_tokenizer(args: ServerArgs) -> Any:
    """The tokenizer in `args.tokenizer_path`; for random weights in a folder that has none, one
    whose token i reads "<i>", so the text streamed back still shows each token."""
    from minisgl.utils.tokenizer import TOKENIZER_FILES, has_tokenizer, load_tokenizer, placeholder_tokenizer

    path = args.tokenizer_path
    if has_tokenizer(path):
        return load_tokenizer(path)
    if args.engine.dummy_weights and args.server.tokenizer is None:
        from minisgl.models.config import ModelConfig

        say(f"{path} holds no tokenizer: token i reads as '<i>' (random weights)")
        return placeholder_tokenizer(ModelConfig.from_dir(path).vocab_size)
    raise FileNotFoundError(f"{path} holds no tokenizer (none of {', '.join(TOKENIZER_FILES)}): pass --tokenizer DIR")


class Backend:
    """The scheduler and tokenizer processes. Use as a context manager (start, and stop on leaving),
    or drive `starting()` yourself, as the HTTP server does so that it answers while they start.

    Start-up state, for whoever reports it: `waiting_for` (what start-up waits for now, None once
    ready), `ready`, and `failed` (why start-up failed, else None). `report` is called with each new
    `waiting_for`, so a terminal can print what it waits for. Once ready, `info` holds what the
    children reported: the context length, KV pages and device, and whether there is a chat template."""

    def __init__(self, args: ServerArgs, timeout_s: float = 600.0, report: Callable[[str], None] = lambda what: None):
        self.args = args
        self.folder = tempfile.mkdtemp(prefix="minisgl-")
        self.addrs = Addresses.in_folder(self.folder)
        self.procs: List[mp.Process] = []
        self.timeout_s = timeout_s
        self.info: dict = {}
        self.report = report
        self.waiting_for: Optional[str] = None
        self.ready = False
        self.failed: Optional[str] = None

    def _waiting(self, what: str) -> None:
        self.waiting_for = what
        self.report(what)

    def starting(self) -> Iterator[None]:
        """Start the scheduler and the tokenizer worker together; once the scheduler is ready, hand
        the worker its context length and wait for it too. A generator that yields whenever it waits:
        the caller decides how to wait (`start` sleeps, `start_async` lets an event loop run). On
        failure, or when closed early, it stops whatever it started; a failure raises LaunchError."""
        try:
            pid = os.getpid()
            self._waiting("the scheduler process to start")
            scheduler = self._spawn("scheduler", _run_scheduler, self.args, self.addrs, pid)
            tokenizer = self._spawn("tokenizer", _run_tokenizer, self.args, self.addrs, pid)
            self.info = yield from self._wait_for("scheduler", *scheduler)
            self._waiting("the tokenizer worker to load the tokenizer")
            yield from self._wait_for("tokenizer", *tokenizer, until="loaded")
            tokenizer[1].send(self.info["max_seq_len"])
            self.info.update((yield from self._wait_for("tokenizer", *tokenizer)))
        except BaseException as e:
            if isinstance(e, Exception):
                self.failed = str(e)
            self.stop()
            raise
        self.waiting_for, self.ready = None, True

    def start(self) -> None:
        for _ in self.starting():
            time.sleep(POLL_S)

    async def start_async(self) -> None:
        steps = self.starting()
        try:
            for _ in steps:
                await asyncio.sleep(POLL_S)
        finally:
            steps.close()  # cancelled while waiting: stop the children now, not when collected

    def _spawn(self, name: str, target: Any, *args: Any) -> Tuple[mp.Process, Connection]:
        """Start one child; returns it and our end of its pipe (it reports there, we may answer)."""
        ctx = mp.get_context("spawn")  # never fork a process that may hold CUDA or threads
        parent, child = ctx.Pipe()
        # a scheduler leading tensor-parallel ranks starts processes of its own, which a daemonic
        # process may not; it still dies with us (see _child_setup)
        daemon = not (name == "scheduler" and self.args.engine.tp_size > 1)
        proc = ctx.Process(target=target, args=(*args, child), name=f"minisgl-{name}", daemon=daemon)
        proc.start()
        self.procs.append(proc)
        child.close()
        return proc, parent

    def _wait_for(self, name: str, proc: mp.Process, parent: Connection,
                  until: str = "ok") -> Generator[None, None, Any]:
        """Wait (yielding) until the child reports `until`; returns what it reported with it."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            while parent.poll():  # no timeout: only what is there already
                try:
                    status, payload = parent.recv()
                except EOFError:
                    proc.join(5)
                    raise LaunchError(f"the {name} process died while starting (exit code {proc.exitcode}); see "
                                      "its output above") from None
                if status == until:
                    return payload
                if status == "error":
                    raise LaunchError(f"the {name} process failed to start: {payload}")
                self._waiting(payload)  # "waiting": what it does now
            if time.monotonic() > deadline:
                raise LaunchError(f"the {name} process did not start within {self.timeout_s} s")
            yield

    def __enter__(self) -> "Backend":
        self.start()
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
