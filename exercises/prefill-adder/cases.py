"""Cases for prefill-adder: admission decisions on scripted and random queues, and engine runs."""

import random
from typing import List

from judge import harness
from judge.api import E2E, Obs, case, snapshot
from minisgl.core import SamplingParams
from minisgl.scheduler.prefill import PrefillAdder


def _admit_queue(obs: Obs, table, cache, budget: int, reserved: int, queue: List) -> None:
    """Offer the queue in order until a request is refused (FCFS), recording every decision."""
    adder = PrefillAdder(budget, reserved, table, cache)
    for p in queue:
        before = snapshot(p.input_ids)
        req = adder.try_admit(p)
        obs.unchanged(f"request {p.uid}: its prompt ids", before, p.input_ids)
        if req is None:
            obs.eq(f"request {p.uid}: admitted?", False)
            break
        obs.eq(f"request {p.uid}: admitted?", True)
        obs.eq(f"request {p.uid}: (uid, table row, cached_len, device_len, max_device_len)",
               [req.uid, req.table_idx, req.cached_len, req.device_len, req.max_device_len])
        obs.eq(f"request {p.uid}: is_chunk", req.is_chunk)
        obs.eq(f"request {p.uid}: token pool row holds the prompt", table.token_pool[req.table_idx, : req.prompt_len])
        obs.eq(f"request {p.uid}: page-table row holds the cached prefix's slots", table.page_table[req.table_idx, : req.cached_len])
        obs.eq(f"after request {p.uid}: (token_budget, reserved_pages)", [adder.token_budget, adder.reserved_pages])
    obs.eq("after admission: free table rows", table.available_size)
    obs.eq("after admission: prefix cache (locked, evictable) tokens", [cache.prefix_cache.protected_size, cache.prefix_cache.evictable_size])
    cache.prefix_cache.check_integrity()


@case("two short requests fit", hint=1)
def two_fit(obs: Obs) -> None:
    table, cache = harness.managers(rows=4, num_pages=64)
    _admit_queue(obs, table, cache, 100, 0, [harness.pending(0, range(10, 18), 4), harness.pending(1, range(30, 35), 4)])


@case("the table has one free row", hint=1)
def table_full(obs: Obs) -> None:
    table, cache = harness.managers(rows=1, num_pages=64)
    _admit_queue(obs, table, cache, 100, 0, [harness.pending(0, range(10, 18), 4), harness.pending(1, range(30, 35), 4)])


@case("the token budget cuts the second prompt into a chunk, then runs out", hint=3)
def budget_cut(obs: Obs) -> None:
    table, cache = harness.managers(rows=4, num_pages=64)
    _admit_queue(obs, table, cache, 12, 0, [harness.pending(0, range(10, 18), 4), harness.pending(1, range(30, 45), 4), harness.pending(2, [7, 8], 2)])


@case("pages already promised to running requests count (reserved_pages)", hint=2)
def reserved(obs: Obs) -> None:
    table, cache = harness.managers(rows=4, num_pages=30)
    _admit_queue(obs, table, cache, 100, 12, [harness.pending(0, range(10, 20), 5), harness.pending(1, range(30, 40), 5)])


@case("a prefix-cache hit: its pages are not new, and a refused request leaves the cache as it was", hint=2)
def prefix_hit(obs: Obs) -> None:
    table, cache = harness.managers(rows=4, num_pages=24, page_size=2)
    harness.cache_prefix(cache, list(range(10, 22)))
    harness.cache_prefix(cache, list(range(40, 48)))
    _admit_queue(obs, table, cache, 100, 0, [harness.pending(0, list(range(10, 22)) + [5, 6, 7], 3), harness.pending(1, list(range(40, 48)) + [9] * 9, 30)])


@case("prompts sharing a chat template (the engine makes a prompt wait when the batch already computes its template)", hint=3)
def shared_prefix_waits(obs: Obs) -> None:
    table, cache = harness.managers(rows=6, num_pages=96, page_size=2)
    template = list(range(100, 120))  # 20 tokens, as a chat template would be
    harness.cache_prefix(cache, list(range(200, 220)))
    _admit_queue(obs, table, cache, 200, 0, [
        harness.pending(0, list(range(200, 220)) + [5, 6], 3),  # shares only what the cache holds
        harness.pending(1, list(range(200, 220)) + [7, 8], 3),
        harness.pending(2, template + [5, 6, 7], 3),
        harness.pending(3, template[:10] + [9] * 12, 3),  # 10 shared tokens: too few to wait for
        harness.pending(4, template + [8, 9], 3),  # would compute the template again: waits
        harness.pending(5, [3, 4], 3),
    ])


@case("random queues, pools and caches", seeds=4, hint=2)
def random_queues(obs: Obs, seed: int) -> None:
    rng = random.Random(seed)
    ps = rng.choice([1, 2, 4])
    table, cache = harness.managers(rows=rng.randint(1, 4), num_pages=rng.randint(12, 48) // ps * 2, page_size=ps)
    prefixes = [[rng.randrange(10, 60) for _ in range(rng.randint(2, 16))] for _ in range(rng.randint(0, 2))]
    for p in prefixes:
        harness.cache_prefix(cache, p)
    queue = []
    for uid in range(rng.randint(1, 6)):
        head = list(rng.choice(prefixes)) if prefixes and rng.random() < 0.6 else []
        queue.append(harness.pending(uid, head + [rng.randrange(10, 60) for _ in range(rng.randint(1, 12))], rng.randint(1, 10)))
    obs.eq("scenario: page size, pages, rows", [ps, cache.num_pages, table.max_running_reqs])
    _admit_queue(obs, table, cache, rng.randint(4, 40), rng.randint(0, 6), queue)


@case("tiny-llama: 6 requests through a small KV pool (admission waits for pages)", kind=E2E, hint=2)
def engine_small_pool(obs: Obs) -> None:
    prompts = harness.random_prompts(seed=11, n=6, lo=4, hi=16, shared_prefix=4)
    cfg = harness.scheduler_config(num_pages=48, max_running_reqs=3, max_extend_tokens=24)
    harness.generate(obs, cfg, prompts, SamplingParams(max_tokens=6, ignore_eos=True), rounds=2)
