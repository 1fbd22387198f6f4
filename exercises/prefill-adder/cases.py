"""Cases for prefill-adder: admission decisions on chapter 7's managers (a page allocator and no
prefix cache, so every prompt is computed whole), scripted and random, and runs of chapter 7's
scheduler."""

import random
from typing import List

from judge import harness
from minisgl.scheduler.scheduler import Scheduler
from judge.api import E2E, Obs, case, snapshot
from minisgl.core import SamplingParams
from minisgl.scheduler.prefill import PrefillAdder


def _managers(rows: int, num_pages: int, page_size: int = 1):
    return harness.managers(rows=rows, num_pages=num_pages, page_size=page_size, prefix_cache=None)


def _admit_queue(obs: Obs, table, cache, budget: int, reserved: int, queue: List, stop_at_refusal: bool = True) -> None:
    """Offer the queue in order to one adder, recording every decision; stop at the first refusal
    unless `stop_at_refusal` is False (then the decisions after a refusal are graded too)."""
    adder = PrefillAdder(budget, reserved, table, cache)
    for p in queue:
        before = snapshot(p.input_ids)
        req = adder.try_admit(p)
        obs.unchanged(f"request {p.uid}: its prompt ids", before, p.input_ids)
        obs.eq(f"request {p.uid}: admitted?", req is not None)
        if req is not None:
            obs.eq(f"request {p.uid}: (uid, table row, seed, cached_len, device_len, max_device_len)",
                   [req.uid, req.table_idx, req.seed, req.cached_len, req.device_len, req.max_device_len])
            obs.eq(f"request {p.uid}: token pool row holds the prompt", table.token_pool[req.table_idx, : req.prompt_len])
        obs.eq(f"after request {p.uid}: (token_budget, spent, reserved_pages)", [adder.token_budget, adder.spent, adder.reserved_pages])
        if req is None and stop_at_refusal:
            break
    obs.eq("after admission: (free table rows, free pages)", [table.available_size, cache.free_pages])


@case("two short requests fit", hint=1)
def two_fit(obs: Obs) -> None:
    table, cache = _managers(rows=4, num_pages=64)
    _admit_queue(obs, table, cache, 100, 0, [harness.pending(0, range(10, 18), 4), harness.pending(1, range(30, 35), 4, seed=7)])


@case("the table has one free row", hint=1)
def table_full(obs: Obs) -> None:
    table, cache = _managers(rows=1, num_pages=64)
    _admit_queue(obs, table, cache, 100, 0, [harness.pending(0, range(10, 18), 4), harness.pending(1, range(30, 35), 4)])


@case("a prompt larger than the budget left waits for the next batch", hint=2)
def over_budget(obs: Obs) -> None:
    table, cache = _managers(rows=4, num_pages=64)
    _admit_queue(obs, table, cache, 12, 0, [harness.pending(0, range(10, 18), 4), harness.pending(1, range(30, 45), 4), harness.pending(2, [7, 8], 2)])


@case("two prompts use the budget up exactly; the next one waits", hint=2)
def budget_exact(obs: Obs) -> None:
    table, cache = _managers(rows=4, num_pages=64)
    _admit_queue(obs, table, cache, 12, 0, [harness.pending(0, range(10, 18), 4), harness.pending(1, range(30, 34), 4), harness.pending(2, [7], 2)])


@case("the batch's first prompt joins though it is larger than the budget", hint=2)
def first_over_budget(obs: Obs) -> None:
    table, cache = _managers(rows=4, num_pages=64)
    _admit_queue(obs, table, cache, 8, 0, [harness.pending(0, range(10, 30), 4), harness.pending(1, [7, 8], 2)])


@case("pages already promised to running requests count (reserved_pages)", hint=3)
def reserved(obs: Obs) -> None:
    table, cache = _managers(rows=4, num_pages=30)
    _admit_queue(obs, table, cache, 100, 12, [harness.pending(0, range(10, 20), 5), harness.pending(1, range(30, 40), 5)])


@case("each admitted request's whole life is promised: the second does not fit beside the first", hint=3)
def promises_add_up(obs: Obs) -> None:
    table, cache = _managers(rows=4, num_pages=40, page_size=2)
    _admit_queue(obs, table, cache, 100, 0, [harness.pending(0, range(10, 16), 60), harness.pending(1, range(20, 26), 10)])


@case("a request whose life fills the pool exactly fits (its last token needs no KV)", hint=3)
def exact_fit(obs: Obs) -> None:
    for ps in (1, 4):
        table, cache = _managers(rows=2, num_pages=(12 + 9 - 1) // ps)
        _admit_queue(obs, table, cache, 100, 0, [harness.pending(ps, range(10, 22), 9)])


@case("random queues, pools and budgets", seeds=4, hint=3)
def random_queues(obs: Obs, seed: int) -> None:
    rng = random.Random(seed)
    ps = rng.choice([1, 2, 4])
    table, cache = _managers(rows=rng.randint(1, 4), num_pages=rng.randint(6, 30), page_size=ps)
    queue = [harness.pending(uid, [rng.randrange(10, 60) for _ in range(rng.randint(1, 24))], rng.randint(1, 12), seed=rng.randrange(100))
             for uid in range(rng.randint(1, 8))]
    budget, reserved = rng.randint(1, 40), rng.randint(0, 6)
    obs.eq("scenario: page size, pages, rows, budget, reserved", [ps, cache.num_pages, table.max_running_reqs, budget, reserved])
    _admit_queue(obs, table, cache, budget, reserved, queue, stop_at_refusal=False)


@case("tiny-llama: 6 requests through a small KV pool (admission waits for pages)", kind=E2E, hint=3)
def engine_small_pool(obs: Obs) -> None:
    prompts = harness.random_prompts(seed=11, n=6, lo=4, hi=16, shared_prefix=4)
    cfg = harness.scheduler_config(num_pages=48, max_running_reqs=3, max_extend_tokens=24, prefix_cache="naive")
    # chapter 7's scheduler: whole prompts, each batch read before the next
    harness.generate(obs, cfg, prompts, SamplingParams(max_tokens=6, ignore_eos=True), rounds=2, bases=(Scheduler,))
