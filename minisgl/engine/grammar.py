"""JSON-constrained decoding with xgrammar: a grammar per request, a token bitmask per step.

xgrammar compiles a JSON schema (or "any JSON object") against the tokenizer's vocabulary once,
then a `GrammarMatcher` per request tracks where in the grammar the output is and answers, for
the next position, which token ids may follow: a bitmask of `ceil(vocab / 32)` int32 words per
row. The sampler sets every other token's logit to -inf (`processors.apply_token_bitmask`), so
the output is valid JSON by construction; once the JSON is complete only end-of-sequence tokens
are allowed, and the request stops.

Matchers advance on the host tokens of their request (`Req.output_ids`), caught up lazily when
the next bitmask is filled, so nothing else in the loop needs to tell them about tokens. The
bitmask for position N+1 needs token N on the host: with overlap scheduling, the scheduler
processes the previous results first while grammar requests run.

Compiling can take seconds (a schema nested a few hundred levels deep, or a pattern of nested
repetitions, takes time that grows far faster than its size). The offline `LLM` compiles when a
request is added; a server must not, since every other stream would wait: there `AsideCompiler`
compiles in a child process, watched by a thread, within a size and a time limit.
"""

from __future__ import annotations

import ctypes
import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple

import torch

from minisgl.env import child_environment
from minisgl.core import InvalidRequestError, Req, SamplingParams
from minisgl.utils.tokenizer import has_tokenizer, load_tokenizer

# "a JSON object" (json_mode="object"): any keys and values, but an object, as OpenAI's json_object
ANY_OBJECT = json.dumps({"type": "object"})
CACHE_BYTES = 256 * 1024 * 1024  # compiled grammars kept for repeats (a deep schema's is megabytes)
STARTUP_S = 120.0  # the compiling child imports xgrammar and torch (seconds on a busy CPU)
Key = Tuple[str, str]  # (json_mode, schema text): what a compiled grammar depends on


def grammar_key(params: SamplingParams) -> Key:
    return params.json_mode, ANY_OBJECT if params.json_mode == "object" else params.json_schema


QUOTE_CHARS = 40  # of the client's schema, quoted in the compiler's reason
_LOG_PREFIX = re.compile(r"^\s*(\[[\d:]+\]\s*)?\S+\.(cc|cpp|h|hpp|py):\d+:\s*")  # "[16:49:24] /src/x.cc:88: "
_LONG = re.compile(r"(\"[^\"]{%d,}\"|'[^']{%d,}'|\S{%d,})" % ((QUOTE_CHARS,) * 3))


def compiler_reason(text: str) -> str:
    """xgrammar's error, fit for a client: its first line, without the log prefix that names the
    compiler's source file, each quote of the schema (or any long word) cut to `QUOTE_CHARS`."""
    line = _LOG_PREFIX.sub("", text.strip().splitlines()[0] if text.strip() else "")
    return _LONG.sub(lambda m: m.group(0)[:QUOTE_CHARS] + "...", line)[:300]


def _compile_with(compiler: Any, key: Key) -> Any:
    mode, schema = key
    try:
        # compact JSON: a small model left free to add whitespace may emit it forever
        return compiler.compile_json_schema(schema, any_whitespace=False, strict_mode=mode == "schema")
    except (RuntimeError, ValueError, TypeError) as e:
        reason = compiler_reason(str(e))
        raise InvalidRequestError(f"json_schema cannot be used to constrain decoding: {reason}") from None


@dataclass
class _Tracked:
    matcher: Any  # xgrammar.GrammarMatcher
    accepted: int = 0  # output tokens fed to the matcher so far


class GrammarManager:
    """The grammars of the live JSON requests, by uid. Built lazily: the tokenizer and xgrammar
    load on the first JSON request only."""

    def __init__(self, model_path: str | Path, vocab_size: int, eos_ids: Iterable[int]):
        self.model_path = Path(model_path)
        self.vocab_size = vocab_size
        self.eos_ids = sorted(set(eos_ids))
        self.tracked: Dict[int, _Tracked] = {}
        self.aside: Optional[AsideCompiler] = None  # set by a server: compile beside the loop
        self._compiler: Any = None
        self._batch_matcher: Any = None
        self._info: Any = None
        self._ready: "OrderedDict[Key, Any]" = OrderedDict()  # compiled grammars, least recent first
        self._lock = threading.Lock()  # guards _ready (the aside thread reads it)
        self._info_lock = threading.Lock()

    @property
    def active(self) -> bool:
        return bool(self.tracked)

    def tokenizer_info(self) -> Any:
        """xgrammar's view of the vocabulary (loads the tokenizer once)."""
        with self._info_lock:
            if self._info is None:
                import xgrammar as xgr

                if not has_tokenizer(self.model_path):
                    raise InvalidRequestError(f"{self.model_path} has no tokenizer, which JSON mode needs; turn "
                                              "json_mode off")
                tokenizer = load_tokenizer(self.model_path)
                # the model's vocabulary may be padded past the tokenizer's; those ids are never allowed
                self._info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=self.vocab_size,
                                                                stop_token_ids=self.eos_ids)
            return self._info

    def _get_compiler(self) -> Any:
        if self._compiler is None:
            import xgrammar as xgr

            self._compiler = xgr.GrammarCompiler(self.tokenizer_info(), cache_enabled=True,
                                                 cache_limit_bytes=CACHE_BYTES)
        return self._compiler

    def cached(self, key: Key) -> Any:
        with self._lock:
            if key in self._ready:
                self._ready.move_to_end(key)
            return self._ready.get(key)

    def remember(self, key: Key, grammar: Any) -> None:
        with self._lock:
            self._ready[key] = grammar
            while len(self._ready) > 1 and sum(g.memory_size_bytes for g in self._ready.values()) > CACHE_BYTES:
                self._ready.popitem(last=False)

    def compile(self, params: SamplingParams) -> Any:
        """The compiled grammar of a JSON request (one compiled aside, or a repeat, is at hand;
        else it is compiled now); InvalidRequestError if the schema is one xgrammar cannot use."""
        key = grammar_key(params)
        grammar = self.cached(key)
        if grammar is None:
            grammar = _compile_with(self._get_compiler(), key)
            self.remember(key, grammar)
        return grammar

    def compiled(self) -> Iterator[Tuple[Any, Optional[str]]]:
        """(payload, error or None) of each request whose grammar was compiled aside since the last
        call; with no error its grammar is at hand for `compile`, so add the request right away."""
        return self.aside.ready() if self.aside is not None else iter(())

    def add(self, uid: int, params: SamplingParams) -> None:
        """Start tracking a JSON request (no-op for others)."""
        if params.json_mode == "off":
            return
        import xgrammar as xgr

        self.tracked[uid] = _Tracked(xgr.GrammarMatcher(self.compile(params)))

    def release(self, uid: int) -> None:
        self.tracked.pop(uid, None)

    def fill(self, reqs: List[Req]) -> Optional[torch.Tensor]:
        """The next token's bitmask for a batch about to be launched: `[bs, words]` int32 on the
        host, all ones for rows without a grammar; None when no row has one."""
        rows = [(i, self.tracked.get(r.uid)) for i, r in enumerate(reqs)]
        rows = [(i, t, reqs[i]) for i, t in rows if t is not None and not reqs[i].finished and not reqs[i].is_chunk]
        if not rows:
            return None
        import xgrammar as xgr

        bitmask = xgr.allocate_token_bitmask(len(reqs), self.vocab_size)  # all ones
        live, where = [], []
        for i, t, req in rows:
            assert len(req.input_ids) == req.device_len, (
                f"req {req.uid}: the grammar needs every sampled token on the host before the next step "
                f"({len(req.input_ids)} of {req.device_len}); process results before launching"
            )
            for token in req.output_ids[t.accepted :].tolist():
                assert t.matcher.accept_token(token), f"req {req.uid}: token {token} broke its grammar"
                t.accepted += 1
            if not t.matcher.is_terminated():
                live.append(t.matcher)
                where.append(i)
        if live:
            self._batch_matcher = self._batch_matcher or xgr.BatchGrammarMatcher()
            self._batch_matcher.batch_fill_next_token_bitmask(live, bitmask, where)
        return bitmask


@dataclass(frozen=True)
class CompileLimits:
    timeout_s: float  # a compile still running then is killed and its request refused
    max_bytes: int  # a schema text larger than this is refused before compiling


class AsideCompiler:
    """Compiles grammars beside the scheduler's loop, within `CompileLimits`.

    The loop `submit`s a JSON request and goes on stepping the others. A thread takes each schema
    in turn, sends it to a child process that compiles it (at a lower CPU priority), and reads
    back the serialised grammar; if none comes within the time limit, the child is killed (the
    next schema starts a fresh one) and the request is refused. The loop collects the outcomes
    with `ready()`. A request aborted while its schema compiles is dropped with `cancel`.
    """

    def __init__(self, manager: GrammarManager, limits: CompileLimits):
        self.manager = manager
        self.limits = limits
        self.waiting: Dict[int, Any] = {}  # uid -> payload, until its grammar is ready
        self._jobs: "queue.SimpleQueue[Tuple[int, Key]]" = queue.SimpleQueue()
        self._done: "queue.SimpleQueue[Tuple[int, Key, Any, Optional[str]]]" = queue.SimpleQueue()
        self._thread: Optional[threading.Thread] = None
        self._child: Optional[subprocess.Popen] = None
        self._conn: Optional[Connection] = None

    @property
    def busy(self) -> bool:
        return bool(self.waiting)

    def submit(self, uid: int, params: SamplingParams, payload: Any) -> None:
        self.waiting[uid] = payload
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="minisgl-grammar", daemon=True)
            self._thread.start()
        self._jobs.put((uid, grammar_key(params)))

    def cancel(self, uid: int) -> bool:
        """Forget a request whose grammar is not ready yet; False if there was none."""
        return self.waiting.pop(uid, None) is not None

    def ready(self) -> Iterator[Tuple[Any, Optional[str]]]:
        while True:
            try:
                uid, key, grammar, error = self._done.get_nowait()
            except queue.Empty:
                return
            payload = self.waiting.pop(uid, None)
            if payload is None:
                continue  # aborted while compiling
            if error is None:
                self.manager.remember(key, grammar)
            yield payload, error

    # ---- the thread ------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            uid, key = self._jobs.get()
            if uid not in self.waiting:
                continue  # aborted while queued
            grammar, error = self.manager.cached(key), None
            if grammar is None:
                try:
                    grammar = self._compile(key)
                except InvalidRequestError as e:
                    error = str(e)
                except Exception as e:  # the request fails, not the thread (later ones still compile)
                    self._stop_child()
                    error = ("json_schema cannot be used to constrain decoding: the grammar compiler failed "
                             f"({type(e).__name__})")
            self._done.put((uid, key, grammar, error))

    def _compile(self, key: Key) -> Any:
        import xgrammar as xgr

        size = len(key[1].encode())
        if size > self.limits.max_bytes:
            raise InvalidRequestError(f"json_schema is {size} bytes, over this server's limit of "
                                      f"{self.limits.max_bytes} (--max-schema-bytes)")
        info = self.manager.tokenizer_info()
        conn = self._connection(info)
        conn.send(key)
        if not conn.poll(self.limits.timeout_s):
            self._stop_child()
            raise InvalidRequestError(
                f"json_schema did not compile within this server's limit of {self.limits.timeout_s:g} s "
                "(--grammar-timeout): "
                "use fewer nested levels and repetitions"
            )
        try:
            status, payload = conn.recv()
        except (EOFError, OSError):
            self._stop_child()
            raise InvalidRequestError("json_schema cannot be used to constrain decoding: its compilation "
                                      "failed") from None
        if status != "ok":
            raise InvalidRequestError(payload)
        return xgr.CompiledGrammar.deserialize_json(payload, info)

    def _connection(self, info: Any) -> Connection:
        if self._child is None or self._child.poll() is not None:
            self._stop_child()
            ours, theirs = socket.socketpair()
            cmd = [sys.executable, "-c", "from minisgl.engine.grammar import child_main; "
                                         f"child_main({theirs.fileno()})"]
            env = child_environment(Path(__file__).resolve().parents[2])  # this copy of minisgl, wherever it runs from
            self._child = subprocess.Popen(cmd, pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, env=env)
            theirs.close()
            self._conn = Connection(ours.detach())
            self._conn.send(info.serialize_json())
            if not self._conn.poll(STARTUP_S) or self._conn.recv() != ("ready", None):
                self._stop_child()
                raise RuntimeError(f"the grammar compiler process did not start within {STARTUP_S:g} s")
        return self._conn

    def _stop_child(self) -> None:
        if self._child is not None:
            self._child.kill()
            self._child.wait()
            self._child = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def child_main(fd: int) -> None:
    """The compiling child: it receives the vocabulary once, then compiles each schema it is sent
    and answers ("ok", the serialised grammar) or ("error", why). It ends with its parent."""
    try:  # Linux: killed with the scheduler even if that is SIGKILLed
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass
    os.nice(10)  # the scheduler's steps come first
    import xgrammar as xgr

    conn = Connection(fd)
    try:
        info = xgr.TokenizerInfo.deserialize_json(conn.recv())
        compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=True, cache_limit_bytes=CACHE_BYTES)
        conn.send(("ready", None))
        while True:
            key = conn.recv()
            try:
                conn.send(("ok", _compile_with(compiler, key).serialize_json()))
            except InvalidRequestError as e:
                conn.send(("error", str(e)))
    except EOFError:
        pass  # the scheduler is gone
