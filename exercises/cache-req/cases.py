"""Cases for cache-req: requests admitted, run and released on real managers; engine runs."""

import random

import torch

from judge import harness
from judge.api import E2E, Obs, case
from minisgl.core import SamplingParams
from minisgl.scheduler.chunked import ChunkedPrefillManager


class Sim:
    """The scheduler's bookkeeping without a model: admit, allocate, step, release."""

    def __init__(self, obs: Obs, page_size: int, num_pages: int = 96, chunk: int = 64) -> None:
        self.obs = obs
        self.table, self.cache = harness.managers(rows=4, num_pages=num_pages, page_size=page_size)
        # chunked admission (a prompt longer than `chunk` is cut), so a request can also end
        # halfway through its prompt, as one aborted between chunks does
        self.prefill = ChunkedPrefillManager(self.table, self.cache, chunk)
        self.live = {}

    def admit(self, uid: int, ids, max_tokens: int) -> None:
        self.prefill.add(harness.pending(uid, ids, max_tokens))
        batch = self.prefill.schedule_next_batch(sum(self.cache.pages_to_finish(r) for r in self.live.values()))
        for r in batch.reqs:
            self.live[r.uid] = r
            self.obs.eq(f"request {r.uid} admitted: cached_len", r.cached_len)

    def step(self, uid: int, n: int, rng: random.Random) -> None:
        """n forward passes of one request, with made-up sampled tokens."""
        r = self.live[uid]
        for _ in range(n):
            if r.remain_len == 0:
                break
            if r.prompt_len - r.cached_len > 0 and self.prefill.chunked is r:
                self.prefill.chunked = None
            self.cache.allocate([r])
            r.complete_one()
            if not r.is_chunk and r.device_len > r.prompt_len:
                r.append_host(rng.randrange(10, 40))
        self.obs.eq(f"request {uid}: (cached_len, device_len, tokens known), pages_to_finish",
                    [[r.cached_len, r.device_len, len(r.input_ids)], self.cache.pages_to_finish(r)])

    def release(self, uid: int) -> None:
        r = self.live.pop(uid)
        self.cache.release(r)
        self.table.free(r.table_idx)
        pc = self.cache.prefix_cache
        self.obs.eq(f"after releasing request {uid}: free pages", self.cache.free_pages)
        self.obs.eq(f"after releasing request {uid}: prefix tree", pc.to_text())
        self.obs.eq(f"after releasing request {uid}: (evictable, locked) cached tokens", [pc.evictable_size, pc.protected_size])
        self.cache.check_integrity(list(self.live.values()))


@case("pages_to_finish for a fresh request, page sizes 1 and 4", hint=1)
def to_finish(obs: Obs) -> None:
    for ps in (1, 4):
        sim = Sim(obs, ps)
        sim.admit(0, range(10, 19), 6)
        sim.step(0, 3, random.Random(0))


@case("a finished request's prompt and output go to the prefix cache", hint=2)
def one_release(obs: Obs) -> None:
    sim = Sim(obs, 1)
    sim.admit(0, range(10, 16), 4)
    sim.step(0, 4, random.Random(0))
    sim.release(0)


@case("a second request reuses the prefix, and its duplicate slots are freed", hint=3)
def reuse(obs: Obs) -> None:
    rng = random.Random(1)
    sim = Sim(obs, 2)
    sim.admit(0, range(10, 20), 3)
    sim.admit(1, range(10, 20), 3)  # admitted before 0 finishes: it computes the prefix again
    sim.step(0, 3, rng)
    sim.step(1, 3, rng)
    sim.release(0)
    sim.release(1)
    sim.admit(2, list(range(10, 20)) + [7], 2)
    sim.step(2, 2, rng)
    sim.release(2)


@case("a request aborted halfway through its prompt", hint=2)
def aborted(obs: Obs) -> None:
    sim = Sim(obs, 4, chunk=6)
    sim.admit(0, range(10, 30), 4)
    sim.step(0, 1, random.Random(0))
    sim.release(0)


@case("random admissions, steps and releases", seeds=4, hint=3)
def random_runs(obs: Obs, seed: int) -> None:
    rng = random.Random(seed)
    sim = Sim(obs, rng.choice([1, 2, 4]), chunk=rng.randint(4, 40))
    prefixes = [[rng.randrange(10, 30) for _ in range(rng.randint(1, 12))] for _ in range(2)]
    uid = 0
    for _ in range(rng.randint(4, 12)):
        if sim.live and (rng.random() < 0.5 or len(sim.live) == 4):
            victim = rng.choice(sorted(sim.live))
            sim.step(victim, rng.randint(0, 4), rng)
            sim.release(victim)
        else:
            ids = rng.choice(prefixes)[: rng.randint(0, 12)] + [rng.randrange(10, 30) for _ in range(rng.randint(1, 6))]
            sim.admit(uid, ids, rng.randint(1, 5))
            uid += 1


@case("tiny-llama: shared prefixes, two rounds, page size 2", kind=E2E, hint=3)
def engine(obs: Obs) -> None:
    prompts = harness.random_prompts(seed=9, n=5, lo=2, hi=9, shared_prefix=7)
    harness.generate(obs, harness.scheduler_config(page_size=2, num_pages=96, max_running_reqs=3), prompts, SamplingParams(max_tokens=5, ignore_eos=True), rounds=2)
