"""Cases for paged-alloc: page-table rows after scripted and random prefill/decode sequences, engine runs."""

import random

import torch

from judge import harness
from judge.api import E2E, Obs, case, snapshot
from minisgl.core import Req, SamplingParams
from minisgl.kvcache import BaseCacheHandle


def _run(obs: Obs, page_size: int, specs, steps: int, num_pages: int = 64, chunk: int = 10**9, width: int = 64) -> None:
    """specs: (prompt_len, max_tokens) per request; each step allocates for every live request
    (prefill in chunks of `chunk`, then decode), as the scheduler does, and records the rows and
    the pages asked of the free list."""
    table, cache = harness.managers(rows=len(specs), num_pages=num_pages, page_size=page_size, max_seq_len=width)
    take, asked = cache._take_pages, []

    def take_pages(n: int) -> torch.Tensor:
        asked.append(n)
        return take(n)

    cache._take_pages = take_pages
    reqs = []
    for uid, (plen, mx) in enumerate(specs):
        r = Req(torch.arange(plen, dtype=torch.int32), table.allocate(), 0, uid, SamplingParams(max_tokens=mx), BaseCacheHandle(0))
        r.device_len = min(plen, chunk)
        reqs.append(r)
    allocated = {}  # uid -> positions that have slots
    for step in range(steps):
        live = [r for r in reqs if r.remain_len > 0 or r.is_chunk]
        if not live:
            break
        before = snapshot([(r.cached_len, r.device_len) for r in live])
        asked.clear()
        cache.allocate(live)
        obs.unchanged(f"step {step}: the requests' lengths", before, [(r.cached_len, r.device_len) for r in live])
        obs.eq(f"step {step}: pages asked of take_pages, call by call", list(asked))
        for r in live:
            obs.eq(f"step {step}, request {r.uid}: page-table row for positions [0, device_len={r.device_len})", table.page_table[r.table_idx, : r.device_len])
        obs.eq(f"step {step}: free pages", cache.free_pages)
        allocated.update({r.uid: r.device_len for r in live})
        cache.check_integrity([_Owned(r, allocated[r.uid]) for r in reqs if r.uid in allocated])
        for r in live:
            r.complete_one()
            if r.prompt_len - r.cached_len > chunk:
                r.device_len = r.cached_len + chunk


class _Owned:
    """What check_integrity reads of a request, with every allocated position counted as owned."""

    def __init__(self, req: Req, allocated: int) -> None:
        self.table_idx, self.cache_handle, self.cached_len = req.table_idx, req.cache_handle, allocated


@case("one request, page size 1: prefill 5 tokens then decode", hint=1)
def one_ps1(obs: Obs) -> None:
    _run(obs, 1, [(5, 3)], steps=4)


@case("one request, page size 4: pages are filled before new ones are taken", hint=2)
def one_ps4(obs: Obs) -> None:
    _run(obs, 4, [(6, 7)], steps=8)


@case("three requests interleaved, page size 4", hint=3)
def three_ps4(obs: Obs) -> None:
    _run(obs, 4, [(3, 6), (9, 2), (4, 5)], steps=8)


@case("chunked prefill, page size 4 (chunks of 6 tokens)", hint=2)
def chunked(obs: Obs) -> None:
    _run(obs, 4, [(17, 3)], steps=8, chunk=6)


@case("a request that ends at the table's width (12 columns, pages of 8)", hint=3)
def at_width(obs: Obs) -> None:
    _run(obs, 8, [(9, 3), (5, 8)], steps=8, width=12)


@case("random requests and page sizes", seeds=4, hint=3)
def random_runs(obs: Obs, seed: int) -> None:
    rng = random.Random(seed)
    ps = rng.choice([1, 2, 4, 8])
    specs = [(rng.randint(1, 20), rng.randint(1, 12)) for _ in range(rng.randint(1, 4))]
    obs.eq("scenario: page size and (prompt_len, max_tokens) per request", [ps, specs])
    _run(obs, ps, specs, steps=40, num_pages=160 // ps, chunk=rng.randint(3, 30))


@case("tiny-llama with pages of 4 and of 16 tokens", kind=E2E, hint=2)
def engine(obs: Obs) -> None:
    prompts = harness.random_prompts(seed=3, n=4, lo=3, hi=21, shared_prefix=8)
    for ps in (4, 16):
        obs.eq("page size", ps)
        harness.generate(obs, harness.scheduler_config(page_size=ps, num_pages=512 // ps, max_extend_tokens=10), prompts, SamplingParams(max_tokens=5, ignore_eos=True), rounds=2)
