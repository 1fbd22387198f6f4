"""Cases for cache-aware: the aged policy's order over many admission steps on scripted and random
queues, prefill schedules with arrivals over time (a stream of cache hits that plain lpm lets
overtake a request for ever, and shared-prefix groups where the bound must keep lpm's hits), and
an engine run."""

import random
from dataclasses import replace
from typing import Dict, List, Optional, Sequence

from judge import harness
from judge.api import E2E, Obs, case, snapshot
from minisgl.core import SamplingParams
from minisgl.scheduler.aging import AgedLongestPrefix
from minisgl.scheduler.chunked import ChunkedPrefillManager
from minisgl.scheduler.prefix import LongestPrefixMatch


def _offer(obs: Obs, policy: AgedLongestPrefix, cache, queue: List, tag: str) -> List:
    """One admission step's order, checked for what it must leave alone; returns it."""
    before = [snapshot(p.input_ids) for p in queue]
    uids = [p.uid for p in queue]
    got = policy.order(queue, cache)
    obs.eq(f"{tag}order of uids", [p.uid for p in got])
    obs.eq(f"{tag}self.waited after the call (uid, steps passed over)", sorted(policy.waited.items()))
    obs.eq(f"{tag}the queue passed in (uids, unchanged)", [p.uid for p in queue] == uids)
    for p, b in zip(queue, before):
        obs.unchanged(f"{tag}request {p.uid}: its prompt ids", b, p.input_ids)
    obs.eq(f"{tag}prefix cache (locked, evictable) tokens after ordering",
           [cache.prefix_cache.protected_size, cache.prefix_cache.evictable_size])
    return got


def _script(obs: Obs, max_wait: int, cache, steps: Sequence[tuple], tag: str = "") -> None:
    """`steps`: (requests arriving, how many of the order admission takes) per admission step."""
    policy, queue = AgedLongestPrefix(max_wait), []
    for k, (arriving, taken) in enumerate(steps):
        queue += arriving
        got = _offer(obs, policy, cache, queue, f"{tag}max_wait {max_wait}, step {k}: ")
        admitted = {p.uid for p in got[:taken]}
        queue = [p for p in queue if p.uid not in admitted]


@case("a request without a hit goes first once it has been passed over max_wait steps", hint=1)
def overdue_first(obs: Obs) -> None:
    _, cache = harness.managers(num_pages=128)
    shared = list(range(10, 30))
    harness.cache_prefix(cache, shared)
    hit = lambda uid: harness.pending(uid, shared + [uid], 2)  # noqa: E731
    loner = harness.pending(0, [5, 6, 7, 8], 2)
    # one hit arrives and one request is admitted per step: under lpm the loner would never go
    steps = [([loner, hit(1)], 1)] + [([hit(uid)], 1) for uid in range(2, 8)]
    _script(obs, 2, cache, steps)


@case("the overdue keep arrival order among themselves, whatever their hits", hint=2)
def overdue_in_arrival_order(obs: Obs) -> None:
    _, cache = harness.managers(num_pages=128)
    harness.cache_prefix(cache, list(range(10, 30)))
    harness.cache_prefix(cache, list(range(50, 58)))
    queue = [harness.pending(0, [5, 6, 7], 2), harness.pending(1, list(range(50, 58)) + [1], 2),
             harness.pending(2, list(range(10, 30)) + [2, 3], 2), harness.pending(3, [9, 9], 2)]
    later = [harness.pending(4, list(range(10, 30)) + [4], 2), harness.pending(5, list(range(50, 56)) + [5], 2)]
    # nobody is admitted for two steps (no room), then two newcomers join the four now overdue
    _script(obs, 2, cache, [(queue, 0), ([], 0), (later, 0), ([], 2), ([], 1), ([], 3)])


@case("max_wait 0 is arrival order; a bound never reached is lpm's order", hint=3)
def extremes(obs: Obs) -> None:
    _, cache = harness.managers(num_pages=128, page_size=4)
    harness.cache_prefix(cache, list(range(10, 26)))
    prompts = [[1, 2, 3, 4, 5], list(range(10, 19)) + [5], list(range(10, 15)) + [1], list(range(10, 26)) + [7], [8, 9]]
    arriving = [[harness.pending(u, prompts[u], 2) for u in (0, 1, 2)], [harness.pending(u, prompts[u], 2) for u in (3, 4)], []]
    for max_wait in (0, 50):
        _script(obs, max_wait, cache, [(arriving[0], 1), (arriving[1], 1), (arriving[2], 2)])


@case("random queues over many admission steps", seeds=4, hint=3)
def order_random(obs: Obs, seed: int) -> None:
    rng = random.Random(seed)
    ps = rng.choice([1, 2, 4])
    _, cache = harness.managers(num_pages=256, page_size=ps)
    stored = [[rng.randrange(3, 9) for _ in range(rng.randint(1, 24))] for _ in range(rng.randint(0, 4))]
    for s in stored:
        harness.cache_prefix(cache, s)
    policy, queue, uid = AgedLongestPrefix(rng.randint(0, 4)), [], 0
    obs.eq("scenario: page size, stored lengths, max_wait", [ps, [len(s) for s in stored], policy.max_wait])
    for step in range(10):
        for _ in range(rng.randint(0, 3)):
            head = list(rng.choice(stored))[: rng.randint(0, 24)] if stored and rng.random() < 0.7 else []
            queue.append(harness.pending(uid, head + [rng.randrange(3, 9) for _ in range(rng.randint(1, 6))], 2))
            uid += 1
        if queue and rng.random() < 0.2:  # a client gives up: its request leaves from anywhere in the queue
            queue.pop(rng.randrange(len(queue)))
        got = _offer(obs, policy, cache, queue, f"step {step}: ")
        taken = {p.uid for p in got[: rng.randint(0, 2)]}
        queue = [p for p in queue if p.uid not in taken]


def _token(uid: int, n: int) -> int:
    return 10 + (uid * 7 + n * 3) % 40  # a made-up "sampled" token, the same in both runs


def _run(obs: Obs, policy, prompts: Sequence[Sequence[int]], max_tokens: Sequence[int], *, rows: int, num_pages: int,
         page_size: int = 1, budget: int = 64, arrivals: Optional[Sequence[int]] = None, warm: Sequence[Sequence[int]] = (),
         max_steps: int = 200, tag: str = "", trace: bool = True) -> Dict[str, object]:
    """Prefill and decode without a model: every request generates made-up tokens and, when done,
    releases its prompt and output into the prefix cache, so later orders depend on earlier ones.
    Returns the prompt tokens computed and, per uid, the prefill batches that admitted a request
    arriving after it while it waited."""
    table, cache = harness.managers(rows=rows, num_pages=num_pages, page_size=page_size, max_seq_len=256)
    for ids in warm:
        harness.cache_prefix(cache, ids)
    pm = ChunkedPrefillManager(table, cache, budget, schedule_policy=policy)
    arrivals = list(arrivals) if arrivals is not None else [0] * len(prompts)
    live, computed, overtaken = [], 0, {uid: 0 for uid in range(len(prompts))}
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
                continue
            reqs = decoding
            if trace:
                obs.eq(f"{tag}step {step}: decode uids", [r.uid for r in reqs])
        else:
            reqs = batch.reqs
            if trace:
                obs.eq(f"{tag}step {step}: prefill (uid, cached_len, extend_len)", [[r.uid, r.cached_len, r.extend_len] for r in reqs])
                obs.eq(f"{tag}step {step}: still waiting (uids in queue order)", [p.uid for p in pm.pending])
            newest = max([r.uid for r in reqs if r not in live], default=-1)
            for p in pm.pending:  # arrival order is uid order
                overtaken[p.uid] += newest > p.uid
            computed += sum(r.extend_len for r in reqs)
            live += [r for r in reqs if r not in live]
            decode_turn = pm.chunked is not None
        cache.allocate(reqs)
        for r in reqs:
            sampled = not r.is_chunk  # asked before complete_one moves a chunk's device_len to the prompt's end
            r.complete_one()
            if sampled:
                r.append_host(_token(r.uid, len(r.input_ids)))
        for r in [r for r in live if len(r.input_ids) - r.prompt_len >= r.sampling_params.max_tokens]:
            live.remove(r)
            cache.release(r)
            table.free(r.table_idx)
        cache.check_integrity(live)
    obs.eq(f"{tag}everyone ran (nobody left waiting or running)", [len(pm.pending), len(live)])
    obs.eq(f"{tag}prompt tokens computed", computed)
    obs.eq(f"{tag}per request: prefill batches that admitted a later arrival while it waited",
           [overtaken[u] for u in range(len(prompts))])
    return dict(computed=computed, overtaken=overtaken)


def _hit_stream(hits: int, loner: int) -> tuple:
    """A cached system prompt, `hits` requests using it (a burst of four, then two every four
    steps), and in place `loner` one request that shares nothing."""
    shared = list(range(100, 116))
    prompts = [shared + [10 + i % 50, 11 + i % 47] for i in range(hits)]
    prompts.insert(loner, [60 + i for i in range(18)])
    arrivals = [0 if i < 4 else 4 * ((i - 4) // 2 + 1) for i in range(len(prompts))]
    return prompts, arrivals, shared


@case("a stream of hits: plain lpm keeps a request waiting, the bound does not", hint=4)
def hit_stream(obs: Obs) -> None:
    prompts, arrivals, shared = _hit_stream(20, 6)
    kw = dict(rows=2, num_pages=200, arrivals=arrivals, warm=[shared])
    lpm = _run(obs, LongestPrefixMatch(), prompts, [4] * len(prompts), tag="lpm (for comparison), ", trace=False, **kw)
    aged = _run(obs, AgedLongestPrefix(3), prompts, [4] * len(prompts), tag="lpm-aged, max_wait 3: ", **kw)
    obs.eq("batches that overtook the request without a hit: lpm, lpm-aged", [lpm["overtaken"][6], aged["overtaken"][6]])
    obs.eq("lpm-aged: no request overtaken by more than 3 batches", max(aged["overtaken"].values()) <= 3)


def _groups(rng: random.Random, groups: int, per_group: int, prefix_len: int, tail: int) -> List[List[int]]:
    prefixes = [[rng.randrange(10, 99) for _ in range(prefix_len)] for _ in range(groups)]
    return [prefixes[i % groups] + [rng.randrange(10, 99) for _ in range(tail)] for i in range(groups * per_group)]


@case("shared-prefix groups under cache pressure: the default bound keeps lpm's hits", hint=5)
def groups_keep_hits(obs: Obs) -> None:
    prompts = _groups(random.Random(1), 4, 4, 12, 2)
    kw = dict(rows=2, num_pages=48)
    lpm = _run(obs, LongestPrefixMatch(), prompts, [2] * len(prompts), tag="lpm (for comparison), ", trace=False, **kw)
    aged = _run(obs, AgedLongestPrefix(), prompts, [2] * len(prompts), tag="lpm-aged, default max_wait: ", **kw)
    obs.eq("prompt tokens computed: lpm, lpm-aged", [lpm["computed"], aged["computed"]])


@case("shared-prefix groups, a tight bound: some hits are traded for the wait", hint=5)
def groups_tight_bound(obs: Obs) -> None:
    prompts = _groups(random.Random(1), 4, 4, 12, 2)
    _run(obs, AgedLongestPrefix(1), prompts, [2] * len(prompts), rows=2, num_pages=48, tag="lpm-aged, max_wait 1: ")


@case("random workloads over time", seeds=4, hint=5)
def random_runs(obs: Obs, seed: int) -> None:
    rng = random.Random(seed)
    ps = rng.choice([1, 2, 4])
    prompts = _groups(rng, rng.randint(1, 4), rng.randint(1, 3), rng.randint(2, 12), rng.randint(1, 4))
    prompts += [[rng.randrange(100, 200) for _ in range(rng.randint(2, 14))] for _ in range(rng.randint(0, 2))]
    max_tokens = [rng.randint(1, 4) for _ in prompts]
    need = max(-(-(len(p) + m - 1) // ps) for p, m in zip(prompts, max_tokens))
    rows, pages, budget = rng.randint(1, 4), need + rng.randint(0, 3 * need), rng.randint(4, 40)
    arrivals = sorted(rng.randint(0, 8) for _ in prompts)
    max_wait = rng.randint(0, 4)
    obs.eq("scenario: page size, pages, rows, budget, max_wait, prompt lengths",
           [ps, pages, rows, budget, max_wait, [len(p) for p in prompts]])
    _run(obs, AgedLongestPrefix(max_wait), prompts, max_tokens, rows=rows, num_pages=pages, page_size=ps, budget=budget,
         arrivals=arrivals)


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


@case("tiny-llama: hits arriving over time and one request without, lpm-aged with overlap", kind=E2E, hint=4)
def engine_aged(obs: Obs) -> None:
    prompts, arrivals, _ = _hit_stream(10, 3)
    cfg = replace(harness.scheduler_config(num_pages=64, max_running_reqs=2, overlap=True), schedule_policy="lpm-aged",
                  lpm_max_wait=2)
    sched = make_scheduler(cfg)
    uids, step = [], 0
    while len(uids) < len(prompts) or not sched.is_idle:
        assert step < 400, "the scheduler is not idle after 400 steps"
        uids += [sched.add_request(p, SamplingParams(max_tokens=3, ignore_eos=True)) for p, a in zip(prompts, arrivals) if a == step]
        sched.step()
        step += 1
    harness.run_until_idle(sched)
    for i, uid in enumerate(uids):
        out = sched.outputs.get(uid, harness.Finished())
        obs.eq(f"request {i}: generated token ids", out.tokens)
        obs.eq(f"request {i}: finish reason", out.finish_reason)
    harness.record_trace(obs, sched.trace)
    sched.assert_all_free()
    obs.eq("after the run: pages held by the prefix cache", sched.cache.prefix_cache.size // sched.cache.page_size)
