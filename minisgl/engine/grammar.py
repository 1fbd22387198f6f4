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
compiles in child processes (`grammar_child.py`), a few schemas at once, each request within a
time limit that counts its wait for a free compiler too.

Compiled grammars are kept for repeats, up to `GrammarManager.cache_bytes`, least recently used
dropped first. A grammar is charged what it holds in memory, which xgrammar's own count
(`memory_size_bytes`) falls far short of for one read back from a child: its serialised size.
"""

from __future__ import annotations

import ctypes
import json
import queue
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Optional, Set, Tuple

import torch

from minisgl.core import InvalidRequestError, Req, SamplingParams
from minisgl.utils.settings import extends_in_place
from minisgl.utils.tokenizer import has_tokenizer, load_tokenizer

from .grammar_child import CompileChild, CompileStopped, Key, compile_schema

# "a JSON object" (json_mode="object"): any keys and values, but an object, as OpenAI's json_object
ANY_OBJECT = json.dumps({"type": "object"})
CACHE_BYTES = 256 * 1024 * 1024  # compiled grammars kept for repeats, by what they hold in memory
LANES = 2  # schemas compiled at once, each in its own process: a slow one leaves the others a lane
JSON_MODES = ("off", "object", "schema")  # what a request's json_mode may be


@extends_in_place(SamplingParams)
@dataclass(frozen=True)
class JsonParams:
    """What a request sets to have its output constrained to JSON: to an object ("object") or to
    `json_schema` ("schema")."""

    json_mode: str = "off"  # "off" | "object" | "schema"
    json_schema: str = ""  # the schema as JSON text, when json_mode == "schema"

    def __post_init__(self) -> None:  # runs on a `SamplingParams`: its own fields are there too
        if self.json_mode not in JSON_MODES:
            raise InvalidRequestError(f"json_mode must be one of {JSON_MODES}, got {self.json_mode!r}")
        if (self.json_mode == "schema") != bool(self.json_schema):
            raise InvalidRequestError("json_schema must be given exactly when json_mode is 'schema'")
        if self.json_mode == "schema":
            try:
                schema = json.loads(self.json_schema)
            except (TypeError, ValueError) as e:
                raise InvalidRequestError(f"json_schema is not valid JSON: {e}") from None
            if not isinstance(schema, (dict, bool)):
                raise InvalidRequestError(f"json_schema must be a JSON object, got {type(schema).__name__}")
        if self.json_mode != "off" and self.ignore_eos:
            raise InvalidRequestError("ignore_eos cannot be combined with json_mode: the grammar ends the output when "
                                      "the JSON is complete")
        if self.json_mode != "off" and self.min_tokens:
            raise InvalidRequestError("min_tokens cannot be combined with json_mode: the grammar decides where the "
                                      "output ends")


def grammar_key(params: SamplingParams) -> Key:
    return params.json_mode, ANY_OBJECT if params.json_mode == "object" else params.json_schema


def release_freed_memory() -> None:
    """Give the heap's free pages back to the system (glibc keeps them otherwise, so a process
    that once held many grammars would stay that large)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc: nothing to trim


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
        self.cache_bytes = CACHE_BYTES  # a server sets its own (--grammar-cache-mb)
        self.keep_wire = False  # keep each grammar's serialised form too, for ranks that must not compile
        self._ready: "OrderedDict[Key, Tuple[Any, int, Optional[str]]]" = OrderedDict()  # least recent first
        self._cached_bytes = 0
        self._lock = threading.Lock()  # guards _ready (the compiling threads read it)
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
                    # the folder's name only: this message may reach a client, the server's paths must not
                    raise InvalidRequestError(f"the model {self.model_path.name} has no tokenizer, which JSON mode "
                                              "needs; turn json_mode off")
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

    @property
    def cached_bytes(self) -> int:
        """What the kept grammars hold in memory, as charged by `remember`."""
        return self._cached_bytes

    def cached(self, key: Key) -> Any:
        with self._lock:
            if key not in self._ready:
                return None
            self._ready.move_to_end(key)
            return self._ready[key][0]

    def remember(self, key: Key, grammar: Any, wire: Optional[str] = None) -> None:
        """Keep a compiled grammar, charged the size of its serialised form `wire` (what one read back
        holds) or xgrammar's own count if larger, twice if the text is kept too (`keep_wire`); the
        least recently used are dropped past `cache_bytes`, the newest never."""
        with self._lock:
            if key in self._ready:
                self._ready.move_to_end(key)
                return
            kept = wire if self.keep_wire else None
            charge = max(len(wire or ""), grammar.memory_size_bytes) + len(kept or "")
            self._ready[key] = (grammar, charge, kept)
            self._cached_bytes += charge
            dropped = 0
            while len(self._ready) > 1 and self._cached_bytes > self.cache_bytes:
                self._cached_bytes -= self._ready.popitem(last=False)[1][1]
                dropped += 1
        if dropped:
            release_freed_memory()  # else the process keeps the pages of grammars it no longer has

    def compile(self, params: SamplingParams) -> Any:
        """The compiled grammar of a JSON request (one compiled aside, or a repeat, is at hand;
        else it is compiled now); InvalidRequestError if the schema is one xgrammar cannot use."""
        key = grammar_key(params)
        grammar = self.cached(key)
        if grammar is None:
            grammar = compile_schema(self._get_compiler(), key)
            self.remember(key, grammar)
        return grammar

    def wire(self, params: SamplingParams) -> Optional[str]:
        """The serialised grammar of a JSON request, if kept (`keep_wire`): what the other
        tensor-parallel ranks get instead of compiling it on their own loops."""
        with self._lock:
            hit = self._ready.get(grammar_key(params))
            return hit[2] if hit is not None else None

    def accept(self, params: SamplingParams, wire: str) -> None:
        """Keep the grammar another rank compiled (`wire`), unless it is at hand already."""
        import xgrammar as xgr

        key = grammar_key(params)
        if self.cached(key) is None:
            self.remember(key, xgr.CompiledGrammar.deserialize_json(wire, self.tokenizer_info()), wire)

    def compiled(self) -> Iterator[Tuple[Any, Optional[str]]]:
        """(payload, error or None) of each request whose grammar was compiled aside since the last
        call (or whose wait ran out); with no error its grammar is at hand for `compile`, so add the
        request right away."""
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
    timeout_s: float  # a request still without its grammar then (queued or compiling) is refused
    max_bytes: int  # a schema text larger than this is refused before compiling


@dataclass
class _Job:
    """One schema to compile, for every request waiting on it."""

    key: Key
    since: float  # when its first request came: the compile is given up at that one's deadline
    waiters: Set[int] = field(default_factory=set)  # uids (changed by the loop's thread only)
    started: bool = False  # a lane took it
    gone: threading.Event = field(default_factory=threading.Event)  # nobody waits for it any more


@dataclass
class _Waiting:
    payload: Any
    key: Key
    since: float  # when it came (time.monotonic)
    job: Optional[_Job] = None  # None: decided when it came (a cached grammar, a schema too large)
    grammar: Any = None  # the cached grammar it found


class AsideCompiler:
    """Compiles grammars beside the scheduler's loop, within `CompileLimits`.

    The loop `submit`s a JSON request and goes on stepping the others; it collects the outcomes
    with `ready()`. A grammar already compiled is ready at once, whatever else compiles. Other
    schemas queue, each once however many requests wait for it, for `lanes` threads that each
    hand a schema to a child process of their own and read back the serialised grammar. Each
    request waits at most `timeout_s` in all, queue included, and is then refused; a compile
    still running for it then, or for requests that all went away (`cancel`), is stopped by
    killing the process that compiles it (the lane's child stays up for the next schema).
    """

    def __init__(self, manager: GrammarManager, limits: CompileLimits, lanes: int = LANES):
        self.manager = manager
        self.limits = limits
        self.waiting: Dict[int, _Waiting] = {}  # uid -> its wait, until `ready` hands it back
        self.children = [CompileChild() for _ in range(lanes)]
        self._jobs: Dict[Key, _Job] = {}  # queued or compiling
        self._queue: "queue.SimpleQueue[_Job]" = queue.SimpleQueue()
        self._done: "queue.SimpleQueue[Tuple[_Job, Any, Optional[str], Optional[str]]]" = queue.SimpleQueue()
        self._decided: List[Tuple[int, Optional[str]]] = []
        self._threads: List[threading.Thread] = []
        self._warm_at: Optional[float] = None  # when the first compiler was up

    @property
    def busy(self) -> bool:
        return bool(self.waiting)

    def submit(self, uid: int, params: SamplingParams, payload: Any) -> None:
        key = grammar_key(params)
        wait = self.waiting[uid] = _Waiting(payload, key, time.monotonic())
        size = len(key[1].encode())
        wait.grammar = self.manager.cached(key)
        if wait.grammar is not None or size > self.limits.max_bytes:
            self._decided.append((uid, None if wait.grammar is not None else (
                f"json_schema is {size} bytes, over this server's limit of {self.limits.max_bytes} "
                "(--max-schema-bytes)")))
            return
        wait.job = self._jobs.get(key)
        if wait.job is None:
            wait.job = self._jobs[key] = _Job(key, wait.since)
            self._queue.put(wait.job)
            self._start_lanes()
        wait.job.waiters.add(uid)

    def cancel(self, uid: int) -> bool:
        """Forget a request whose grammar is not ready yet; False if there was none."""
        wait = self.waiting.pop(uid, None)
        if wait is None:
            return False
        if wait.job is not None:
            self._leave(uid, wait.job)
        return True

    def ready(self) -> Iterator[Tuple[Any, Optional[str]]]:
        decided, self._decided = self._decided, []
        for uid, error in decided:
            wait = self.waiting.pop(uid, None)
            if wait is not None:  # else: aborted meanwhile
                if wait.grammar is not None:  # kept until it is added (if dropped since, charged xgrammar's count)
                    self.manager.remember(wait.key, wait.grammar)
                yield wait.payload, error
        while True:
            try:
                job, grammar, wire, error = self._done.get_nowait()
            except queue.Empty:
                break
            if self._jobs.get(job.key) is job:
                del self._jobs[job.key]
            if error is None:
                self.manager.remember(job.key, grammar, wire)
            for uid in sorted(job.waiters):
                yield self.waiting.pop(uid).payload, error
        yield from self._expired()

    def _deadline(self, since: float) -> float:
        """When a wait that began at `since` runs out. The compilers' first start-up (seconds of
        imports) is the server warming up, not a schema's fault: the clock runs once one is up."""
        warm = self._warm_at if self._warm_at is not None else float("inf")
        return max(since, warm) + self.limits.timeout_s

    def _expired(self) -> Iterator[Tuple[Any, Optional[str]]]:
        now = time.monotonic()
        for uid, wait in list(self.waiting.items()):
            if wait.job is not None and self._deadline(wait.since) <= now:
                del self.waiting[uid]
                self._leave(uid, wait.job)
                yield wait.payload, self._timeout_message(wait.job.started)

    def _timeout_message(self, started: bool) -> str:
        limit = f"this server's limit of {self.limits.timeout_s:g} s (--grammar-timeout)"
        if started:
            return f"json_schema did not compile within {limit}: use fewer nested levels and repetitions"
        return (f"json_schema waited {limit} for one of its {len(self.children)} grammar compilers, all busy "
                "with other schemas: retry later")

    def _leave(self, uid: int, job: _Job) -> None:
        job.waiters.discard(uid)
        if job.waiters:  # the compile may run until the earliest deadline of those still waiting
            job.since = min(self.waiting[u].since for u in job.waiters)
        else:
            job.gone.set()  # a lane skips it, or kills the child compiling it
            if self._jobs.get(job.key) is job:
                del self._jobs[job.key]

    # ---- the lanes (threads) -------------------------------------------------------------------
    def _start_lanes(self) -> None:
        if not self._threads:
            self._threads = [threading.Thread(target=self._lane, args=(c,), name=f"minisgl-grammar-{i}", daemon=True)
                             for i, c in enumerate(self.children)]
            for t in self._threads:
                t.start()

    def _lane(self, child: CompileChild) -> None:
        self._warm(child)
        while True:
            job = self._queue.get()
            if job.gone.is_set():
                continue  # every request for it went away while it queued
            job.started = True
            outcome = self._compile(job, child)
            if outcome is not None:
                self._done.put(outcome)
            self._warm(child)  # a child that died is replaced now, not on the next request's clock

    def _warm(self, child: CompileChild) -> None:
        try:
            child.start(self.manager.tokenizer_info())
            self._warm_at = self._warm_at or time.monotonic()
        except (RuntimeError, OSError, InvalidRequestError):
            child.stop()  # the next schema tries again, and its request is told what failed

    def _compile(self, job: _Job, child: CompileChild) -> Optional[Tuple[_Job, Any, Optional[str], Optional[str]]]:
        """(job, grammar, its serialised form, None) or (job, None, None, why not); None if given up."""
        import xgrammar as xgr

        grammar = self.manager.cached(job.key)  # compiled by another lane since it was queued
        if grammar is not None:
            return job, grammar, None, None
        try:
            info = self.manager.tokenizer_info()
            payload = child.compile(job.key, info, lambda: self._stop_reason(job))
            return job, xgr.CompiledGrammar.deserialize_json(payload, info), payload, None
        except CompileStopped:
            return None
        except InvalidRequestError as e:
            return job, None, None, str(e)
        except Exception as e:  # the request fails, not the lane (later ones still compile)
            child.stop()
            return job, None, None, ("json_schema cannot be used to constrain decoding: the grammar compiler failed "
                                  f"({type(e).__name__})")

    def _stop_reason(self, job: _Job) -> Optional[Exception]:
        if job.gone.is_set():
            return CompileStopped()
        if time.monotonic() >= self._deadline(job.since):
            return InvalidRequestError(self._timeout_message(started=True))
        return None
