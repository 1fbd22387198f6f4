"""Chapter 15: a server's JSON schemas compile in lanes beside the loop. A grammar already
compiled is ready at once, whatever compiles; distinct schemas compile side by side; every
request's wait, queue included, ends within the time limit; a compile nobody waits for any more
is stopped; and the grammars kept for repeats hold a bounded amount of memory.

The `AsideCompiler` of a server is driven directly here (its child processes are real), as the
scheduler's loop drives it: `submit`, then `ready()` between steps.
"""

from __future__ import annotations

import ctypes
import json
import os
import time
from typing import Any, Dict, Optional

import pytest

from minisgl.core import SamplingParams
from minisgl.engine.grammar import AsideCompiler, CompileLimits, GrammarManager
from server_utils import REPO_ROOT, pid_alive

TIMEOUT_S = 2.5
CACHE_MB = 2
SMALL = {"type": "object", "properties": {"a": {"type": "integer"}}}


def slow(tag: str) -> dict:
    """A schema xgrammar takes many seconds to compile (nested repetitions), distinct per tag."""
    return {"type": "object", "properties": {c + tag: {"type": "string", "pattern": f"(({c}{{1,50}}){{1,50}}){{1,20}}"}
                                             for c in "abcdefgh"}}


def wide(tag: str, n: int = 80) -> dict:
    """A schema whose grammar is megabytes in memory (it grows with the square of `n`)."""
    return {"type": "object", "properties": {f"{tag}_{j}": {"type": "string"} for j in range(n)}}


def params(schema: Any) -> SamplingParams:
    return SamplingParams(max_tokens=4, json_mode="schema", json_schema=json.dumps(schema))


class Loop:
    """What the scheduler's loop does with the compiler: submit, then collect between steps."""

    def __init__(self, aside: AsideCompiler):
        self.aside = aside
        self.uid = 0
        self.out: Dict[str, tuple] = {}  # name -> (seconds from its submit, error or None)
        self.submitted: Dict[str, float] = {}

    def submit(self, name: str, schema: Any) -> int:
        self.uid += 1
        self.submitted[name] = time.monotonic()
        self.aside.submit(self.uid, params(schema), name)
        return self.uid

    def collect(self) -> None:
        for name, error in self.aside.ready():
            self.out[name] = (time.monotonic() - self.submitted[name], error)

    def until(self, names, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not all(n in self.out for n in names):
            assert time.monotonic() < deadline, f"not ready within {timeout_s} s: {set(names) - set(self.out)}"
            self.collect()
            time.sleep(0.01)


def lanes_up(aside: AsideCompiler, timeout_s: float = 120.0) -> None:
    """Wait until every lane's compiler process is up and compiles nothing (what the last test
    started may still be ending)."""
    deadline = time.monotonic() + timeout_s
    while not all(c.up and c.compile_pid is None for c in aside.children):
        assert time.monotonic() < deadline, "the compilers did not come up"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def aside():
    manager = GrammarManager(REPO_ROOT / "models/tiny-llama", 32000, [2])
    manager.cache_bytes = CACHE_MB * 1024 * 1024
    compiler = AsideCompiler(manager, CompileLimits(TIMEOUT_S, 1 << 20))
    loop = Loop(compiler)
    loop.submit("warm", SMALL)  # starts the lanes: their first start-up is not on any request's clock
    loop.until(["warm"])
    assert loop.out["warm"][1] is None, loop.out
    yield compiler
    for child in compiler.children:
        child.stop()


@pytest.fixture
def loop(aside):
    lanes_up(aside)
    yield Loop(aside)
    assert not aside.waiting, "a request was left waiting"


def test_a_cached_grammar_is_ready_at_once_while_every_lane_compiles(aside, loop):
    busy = [loop.submit(f"slow{i}", slow(f"c{i}")) for i in range(len(aside.children) + 1)]
    time.sleep(0.3)
    assert all(aside.waiting[uid].job.started for uid in busy[:-1]), "the lanes took the slow schemas"
    loop.submit("cached", SMALL)
    loop.collect()  # the loop's very next look
    assert "cached" in loop.out and loop.out["cached"][1] is None, loop.out
    for uid in busy:
        assert aside.cancel(uid)


def test_distinct_schemas_compile_side_by_side(aside, loop):
    loop.submit("slow", slow("side"))
    time.sleep(0.3)
    loop.submit("fresh", {"type": "object", "properties": {"side": {"type": "string"}}})
    loop.until(["fresh"])
    assert loop.out["fresh"][1] is None, loop.out
    assert "slow" not in loop.out, "the fresh schema waited for the slow one"
    assert aside.cancel(loop.uid - 1)


def test_every_wait_queue_included_ends_within_the_time_limit(aside, loop):
    names = [f"q{i}" for i in range(2 * len(aside.children))]  # half of them queue behind the others
    for name in names:
        loop.submit(name, slow(name))
    loop.until(names)
    for name in names:
        took, error = loop.out[name]
        assert error is not None and "--grammar-timeout" in error and f"{TIMEOUT_S:g} s" in error, (name, error)
        assert took < 1.5 * TIMEOUT_S, f"{name} waited {took:.1f} s, over the limit of {TIMEOUT_S} s"
    assert any("waited" in loop.out[n][1] for n in names), "the queued ones say they waited for a compiler"


def test_a_compile_nobody_waits_for_is_stopped(aside, loop):
    uid = loop.submit("gone", slow("gone"))
    time.sleep(0.3)
    assert aside.waiting[uid].job.started
    compiling = [c.compile_pid for c in aside.children if c.compile_pid is not None]
    assert len(compiling) == 1
    assert aside.cancel(uid)
    t0 = time.monotonic()
    while pid_alive(compiling[0]):
        assert time.monotonic() - t0 < TIMEOUT_S / 2, "the compile ran on after its request went away"
        time.sleep(0.02)


def _rss_mb(pid: Optional[int] = None) -> float:
    pages = int(open(f"/proc/{pid or 'self'}/statm").read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def test_grammar_memory_returns_to_a_bounded_level_after_a_schema_flood(aside, loop):
    manager, limits = aside.manager, aside.limits
    aside.limits = CompileLimits(60.0, limits.max_bytes)  # this test is about memory, on a machine of any pace
    held = manager.cached_bytes
    loop.submit("first", wide("first"))
    loop.until(["first"])
    one_mb = (manager.cached_bytes - held) / 2**20  # what one such grammar is charged: its measured size
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    before = _rss_mb()
    children_before = sum(_rss_mb(c.pid) for c in aside.children)
    flood = [f"w{i}" for i in range(8)]
    for pair in zip(flood[::2], flood[1::2]):  # two at a time: no queueing, whatever the machine's pace
        for name in pair:
            loop.submit(name, wide(name))
        loop.until(pair)
    assert all(loop.out[n][1] is None for n in flood), loop.out
    assert manager.cached_bytes <= max(CACHE_MB, one_mb) * 2**20
    # kept without a bound, the flood would hold len(flood) * one_mb (~18 MB) more, here or in a compiler
    bound = CACHE_MB + 0.25 * len(flood) * one_mb
    grown = _rss_mb() - before
    assert grown < bound, f"the scheduler grew {grown:.1f} MB; one grammar is {one_mb:.1f} MB"
    grown = sum(_rss_mb(c.pid) for c in aside.children) - children_before
    assert grown < bound, f"the compilers grew {grown:.1f} MB; one grammar is {one_mb:.1f} MB"
    aside.limits = limits


def test_other_tensor_parallel_ranks_get_the_grammar_instead_of_compiling_it(aside, loop):
    manager = aside.manager
    manager.keep_wire = True  # what a server leading tensor-parallel ranks sets
    try:
        schema = {"type": "object", "properties": {"rank": {"type": "integer"}}}
        loop.submit("shipped", schema)
        loop.until(["shipped"])
        wire = manager.wire(params(schema))
        assert wire, "rank 0 keeps the serialised grammar for the other ranks"
    finally:
        manager.keep_wire = False
    follower = GrammarManager(REPO_ROOT / "models/tiny-llama", 32000, [2])

    def no_compiling() -> None:
        raise AssertionError("a follower compiled a schema on its own loop")

    follower._get_compiler = no_compiling
    follower.accept(params(schema), wire)
    follower.add(7, params(schema))  # the matcher comes from rank 0's grammar
    assert follower.active
