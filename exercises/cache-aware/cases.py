"""Cases for cache-aware: the policy's order on scripted and random caches, multi-step prefill
schedules with requests finishing into the prefix cache (both policies), and engine runs."""

import random
from dataclasses import replace
from typing import List, Optional, Sequence

from judge import harness
from judge.api import E2E, Obs, case, snapshot
from minisgl.core import SamplingParams
from minisgl.scheduler import prefill
from minisgl.scheduler.chunked import ChunkedPrefillManager


def _order(obs: Obs, cache, queue: List, tag: str = "") -> None:
    """Call the policy directly and record the order, the untouched queue and the cache's locks."""
    before = [snapshot(p.input_ids) for p in queue]
    uids = [p.uid for p in queue]
    got = prefill.longest_prefix_first(queue, cache)
    obs.eq(f"{tag}order of uids", [p.uid for p in got])
    obs.eq(f"{tag}the queue passed in (uids, unchanged)", [p.uid for p in queue] == uids and len(got) == len(queue))
    for p, b in zip(queue, before):
        obs.unchanged(f"{tag}request {p.uid}: its prompt ids", b, p.input_ids)
    obs.eq(f"{tag}prefix cache (locked, evictable) tokens after ordering", [cache.prefix_cache.protected_size, cache.prefix_cache.evictable_size])
    cache.prefix_cache.check_integrity()


@case("the order: longest cached prefix first, equal prefixes by arrival", hint=1)
def order_scripted(obs: Obs) -> None:
    _, cache = harness.managers(num_pages=128)
    harness.cache_prefix(cache, list(range(10, 30)))
    harness.cache_prefix(cache, list(range(50, 58)))
    queue = [harness.pending(0, [5, 6, 7], 2), harness.pending(1, list(range(50, 58)) + [1], 2),
             harness.pending(2, list(range(10, 30)) + [2, 3], 2), harness.pending(3, [9, 9], 2),
             harness.pending(4, list(range(50, 56)) + [4], 2), harness.pending(5, list(range(10, 22)), 2)]
    _order(obs, cache, queue)


@case("a prompt the cache holds whole still computes its last token", hint=2)
def order_whole_prompt(obs: Obs) -> None:
    _, cache = harness.managers(num_pages=64)
    harness.cache_prefix(cache, list(range(10, 19)))  # 9 tokens
    # request 0 shares 8 tokens and continues differently; request 1 *is* a 9-token prefix of the
    # cache, but admission reuses only 8 of it (one prompt token is always computed): a tie
    _order(obs, cache, [harness.pending(0, list(range(10, 18)) + [99], 2), harness.pending(1, list(range(10, 19)), 2)])


@case("pages: hits are counted in whole pages", hint=2)
def order_pages(obs: Obs) -> None:
    _, cache = harness.managers(num_pages=64, page_size=4)
    harness.cache_prefix(cache, list(range(10, 26)))  # 16 tokens, 4 pages
    queue = [harness.pending(0, list(range(10, 15)) + [1, 2, 3], 2),  # shares 5 tokens: 1 page
             harness.pending(1, list(range(10, 17)) + [4], 2),  # shares 7 tokens: still 1 page
             harness.pending(2, list(range(10, 19)) + [5], 2)]  # shares 9 tokens: 2 pages
    _order(obs, cache, queue)


@case("random caches and queues", seeds=4, hint=2)
def order_random(obs: Obs, seed: int) -> None:
    rng = random.Random(seed)
    ps = rng.choice([1, 2, 4])
    _, cache = harness.managers(num_pages=256, page_size=ps)
    stored = [[rng.randrange(3, 9) for _ in range(rng.randint(1, 24))] for _ in range(rng.randint(0, 5))]
    for s in stored:
        harness.cache_prefix(cache, s)
    queue = []
    for uid in range(rng.randint(0, 10)):
        head = list(rng.choice(stored))[: rng.randint(0, 24)] if stored and rng.random() < 0.7 else []
        queue.append(harness.pending(uid, head + [rng.randrange(3, 9) for _ in range(rng.randint(1, 8))], 2))
    obs.eq("scenario: page size, stored lengths, queue length", [ps, [len(s) for s in stored], len(queue)])
    _order(obs, cache, queue)


def _token(uid: int, n: int) -> int:
    return 10 + (uid * 7 + n * 3) % 40  # a made-up "sampled" token, the same in both runs


def _run(obs: Obs, schedule_policy: str, prompts: Sequence[Sequence[int]], max_tokens: Sequence[int], *, rows: int, num_pages: int,
         page_size: int = 1, budget: int = 64, arrivals: Optional[Sequence[int]] = None, warm: Sequence[Sequence[int]] = (),
         max_steps: int = 120) -> None:
    """Prefill and decode without a model: every request generates made-up tokens and, when done,
    releases its prompt and output into the prefix cache, so later orders depend on earlier ones."""
    table, cache = harness.managers(rows=rows, num_pages=num_pages, page_size=page_size, max_seq_len=256)
    for ids in warm:
        harness.cache_prefix(cache, ids)
    pm = ChunkedPrefillManager(table, cache, budget, schedule_policy=schedule_policy)
    arrivals = list(arrivals) if arrivals is not None else [0] * len(prompts)
    live, computed, tag = [], 0, f"{schedule_policy}, "
    decode_turn = False  # as the Scheduler: a step that leaves a prompt half done is followed by a decode step
    for step in range(max_steps):
        harness.arrive(pm, step, prompts, arrivals, max_tokens)
        decoding = [r for r in live if r is not pm.chunked]
        batch = None if decode_turn and decoding else pm.schedule_next_batch(sum(cache.pages_to_finish(r) for r in live))
        decode_turn = False
        if batch is None:
            if not decoding:
                if not pm.pending and step >= max(arrivals):
                    break
                obs.eq(f"{tag}step {step}: nothing to run", True)
                continue
            reqs = decoding
            obs.eq(f"{tag}step {step}: decode uids", [r.uid for r in reqs])
        else:
            reqs = batch.reqs
            obs.eq(f"{tag}step {step}: prefill (uid, cached_len, extend_len)", [[r.uid, r.cached_len, r.extend_len] for r in reqs])
            obs.eq(f"{tag}step {step}: still waiting (uids in queue order)", [p.uid for p in pm.pending])
            computed += sum(r.extend_len for r in reqs)
            live += [r for r in reqs if r not in live]
            decode_turn = pm.chunked is not None
        cache.allocate(reqs)
        for r in reqs:
            # as the scheduler does, ask before the step is launched: complete_one moves a chunk's
            # device_len to the prompt's end, after which is_chunk no longer says it sampled nothing
            sampled = not r.is_chunk
            r.complete_one()
            if sampled:
                r.append_host(_token(r.uid, len(r.input_ids)))
        for r in [r for r in live if len(r.input_ids) - r.prompt_len >= r.sampling_params.max_tokens]:
            live.remove(r)
            cache.release(r)
            table.free(r.table_idx)
        cache.check_integrity(live)
        obs.eq(f"{tag}after step {step}: prefix cache (locked, evictable) tokens", [cache.prefix_cache.protected_size, cache.prefix_cache.evictable_size])
    obs.eq(f"{tag}everyone ran (nobody left waiting or running)", [len(pm.pending), len(live)])
    obs.eq(f"{tag}prompt tokens computed", computed)


def _groups(rng: random.Random, groups: int, per_group: int, prefix_len: int, tail: int) -> List[List[int]]:
    prefixes = [[rng.randrange(10, 99) for _ in range(prefix_len)] for _ in range(groups)]
    return [prefixes[i % groups] + [rng.randrange(10, 99) for _ in range(tail)] for i in range(groups * per_group)]


@case("first come, first served is unchanged (the default policy)", hint=3)
def fcfs_default(obs: Obs) -> None:
    prompts = _groups(random.Random(1), 3, 3, 8, 2)
    _run(obs, "fcfs", prompts, [2] * len(prompts), rows=2, num_pages=40)


@case("lpm: cached groups first, the rest in arrival order", hint=3)
def lpm_pressure(obs: Obs) -> None:
    prompts = _groups(random.Random(1), 3, 3, 8, 2)
    _run(obs, "lpm", prompts, [2] * len(prompts), rows=2, num_pages=40)


@case("lpm: a request that fits is not held behind a refused one", hint=4)
def lpm_refusal(obs: Obs) -> None:
    shared = list(range(10, 30))
    # while request 0 runs, request 1 (a 20-token hit, first in lpm order) needs more pages than
    # are left; request 2 fits, and goes past it
    prompts = [list(range(40, 50)), shared + [1, 2], [8, 9]]
    _run(obs, "lpm", prompts, [6, 26, 2], rows=4, num_pages=60, warm=[shared], arrivals=[0, 1, 1])


@case("lpm: passed over MAX_PASSED_OVER times, a refused request lets nothing ahead of it", hint=4)
def lpm_passed_over(obs: Obs) -> None:
    shared = list(range(10, 30))
    # request 1 needs more pages than request 0 leaves it for a long while; a short request
    # arrives every step, and goes past it until it was passed over often enough
    short = prefill.MAX_PASSED_OVER + 5
    prompts = [list(range(40, 50)), shared + [1, 2]] + [[60 + i, 61] for i in range(short)]
    _run(obs, "lpm", prompts, [20, 26] + [2] * short, rows=4, num_pages=60, warm=[shared],
         arrivals=[0, 1] + list(range(1, short + 1)))


@case("a prompt longer than the budget left is not overtaken: it leads the next step", hint=4)
def budget_refusal(obs: Obs) -> None:
    table, cache = harness.managers(rows=4, num_pages=64)
    pm = prefill.PrefillManager(table, cache, 8)  # chapter 7's: whole prompts only
    for uid, n in enumerate([3, 4, 5, 1]):
        pm.add(harness.pending(uid, range(10 * uid + 1, 10 * uid + 1 + n), 2))
    for step in range(2):
        batch = pm.schedule_next_batch(0)
        obs.eq(f"step {step}: admitted uids", [r.uid for r in batch.reqs] if batch is not None else None)
        obs.eq(f"step {step}: still waiting (uid, passed_over)", [[p.uid, p.passed_over] for p in pm.pending])


@case("lpm: a chunked prompt continues first; arrivals mid-run", hint=5)
def lpm_chunks(obs: Obs) -> None:
    shared = list(range(10, 26))
    prompts = [list(range(40, 70)), shared + [1], [7, 8, 9], shared + [2, 3], list(range(40, 60)) + [4]]
    _run(obs, "lpm", prompts, [3, 2, 2, 2, 2], rows=3, num_pages=200, budget=12, warm=[shared], arrivals=[0, 0, 1, 1, 4])


@case("random workloads, both policies", seeds=4, hint=5)
def random_runs(obs: Obs, seed: int) -> None:
    rng = random.Random(seed)
    ps = rng.choice([1, 2, 4])
    prompts = _groups(rng, rng.randint(1, 4), rng.randint(1, 3), rng.randint(2, 12), rng.randint(1, 4))
    max_tokens = [rng.randint(1, 4) for _ in prompts]
    need = max(-(-(len(p) + m - 1) // ps) for p, m in zip(prompts, max_tokens))
    rows, pages, budget = rng.randint(1, 4), need + rng.randint(0, 3 * need), rng.randint(4, 40)
    arrivals = sorted(rng.randint(0, 5) for _ in prompts)
    obs.eq("scenario: page size, pages, rows, budget, prompt lengths", [ps, pages, rows, budget, [len(p) for p in prompts]])
    for pol in ("fcfs", "lpm"):
        _run(obs, pol, prompts, max_tokens, rows=rows, num_pages=pages, page_size=ps, budget=budget, arrivals=arrivals)


def make_scheduler(config):
    """The engine's complete scheduler (every extension over chapter 7's `Scheduler`: chunked
    prefill, overlap, ...), keeping each request's tokens and finish reason as
    `harness.make_scheduler`'s does."""
    from minisgl.scheduler import scheduler_bases

    class Recording(*scheduler_bases()):
        def __init__(self, cfg):
            super().__init__(cfg)
            self.outputs = {}

        def on_token(self, req, token, finish_reason):
            out = self.outputs.setdefault(req.uid, harness.Finished())
            if token is not None:
                out.tokens.append(int(token))
            out.finish_reason = finish_reason

    return Recording(config)


@case("tiny-llama: shared-prefix traffic under lpm, with overlap scheduling", kind=E2E, hint=5)
def engine_lpm(obs: Obs) -> None:
    prompts = _groups(random.Random(5), 3, 3, 16, 3)
    cfg = replace(harness.scheduler_config(num_pages=64, max_running_reqs=2, overlap=True), schedule_policy="lpm")
    sched = make_scheduler(cfg)
    uids = [sched.add_request(p, SamplingParams(max_tokens=3, ignore_eos=True)) for p in prompts]
    harness.run_until_idle(sched)
    for i, uid in enumerate(uids):
        out = sched.outputs.get(uid, harness.Finished())
        obs.eq(f"request {i}: generated token ids", out.tokens)
        obs.eq(f"request {i}: finish reason", out.finish_reason)
    harness.record_trace(obs, sched.trace)
    sched.assert_all_free()
    obs.eq("after the run: pages held by the prefix cache", sched.cache.prefix_cache.size // sched.cache.page_size)
