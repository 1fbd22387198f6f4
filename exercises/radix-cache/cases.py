"""Cases for radix-cache: scripted and random operation sequences on the tree, and engine runs."""

import random

import torch

from judge import harness
from judge.api import E2E, Obs, case, snapshot
from minisgl.core import SamplingParams
from minisgl.kvcache.radix_cache import RadixPrefixCache


class Driver:
    """Runs operations on a cache and records what a learner can compare: results, tree, sizes."""

    def __init__(self, obs: Obs, page_size: int) -> None:
        self.obs, self.cache, self.ps = obs, RadixPrefixCache(page_size, torch.device("cpu")), page_size
        self.next_slot, self.n, self.handles = 1000, 0, []

    def _state(self, what: str) -> None:
        c = self.cache
        self.obs.eq(f"op {self.n} ({what}): tree", c.to_text())
        self.obs.eq(f"op {self.n} ({what}): (evictable, protected) sizes", [c.evictable_size, c.protected_size])
        c.check_integrity()
        self.n += 1

    def insert(self, ids) -> None:
        ids = torch.tensor(list(ids)[: len(ids) // self.ps * self.ps], dtype=torch.int32)
        slots = torch.arange(self.next_slot, self.next_slot + len(ids), dtype=torch.int32)
        self.next_slot += len(ids)
        before = snapshot((ids, slots))
        kept = self.cache.insert_prefix(ids, slots)
        self.obs.unchanged(f"op {self.n} (insert): the ids and slots you were given", before, (ids, slots))
        self.obs.eq(f"op {self.n} (insert {len(ids)} tokens): length already stored", kept)
        self._state("insert")

    def match(self, ids, lock: bool) -> None:
        ids = torch.tensor(list(ids), dtype=torch.int32)
        before = snapshot(ids)
        handle, indices = self.cache.match_prefix(ids)
        self.obs.unchanged(f"op {self.n} (match): the ids you were given", before, ids)
        self.obs.eq(f"op {self.n} (match {len(ids)} tokens): (cached_len, matched slots)", [handle.cached_len, indices.tolist()])
        if lock:
            self.cache.lock_handle(handle)
            self.handles.append(handle)
        self._state("match and lock" if lock else "match")

    def unlock(self, i: int) -> None:
        self.cache.lock_handle(self.handles.pop(i), unlock=True)
        self._state("unlock")

    def evict(self, n: int) -> None:
        freed = self.cache.evict(n)
        self.obs.eq(f"op {self.n} (evict {n} tokens): freed slots (sorted)", sorted(freed.tolist()))
        self._state("evict")


@case("insert, then match the same and a longer sequence", hint=1)
def insert_match(obs: Obs) -> None:
    d = Driver(obs, 1)
    d.insert([1, 2, 3, 4])
    d.match([1, 2, 3, 4], lock=False)
    d.match([1, 2, 3, 4, 5, 6], lock=False)
    d.match([9, 9], lock=False)


@case("a partial match splits an edge; a second insert shares the prefix", hint=2)
def split(obs: Obs) -> None:
    d = Driver(obs, 1)
    d.insert([1, 2, 3, 4, 5])
    d.match([1, 2, 7], lock=False)
    d.insert([1, 2, 7, 8])
    d.insert([1, 2, 3, 9])


@case("pages of 4: matches stop at whole pages", hint=2)
def pages(obs: Obs) -> None:
    d = Driver(obs, 4)
    d.insert(list(range(1, 13)))
    d.match([1, 2, 3, 4, 5, 6, 0, 0, 9], lock=False)
    d.insert([1, 2, 3, 4, 5, 6, 0, 0])


@case("a locked prefix survives eviction; unlocked, it goes", hint=3)
def locks(obs: Obs) -> None:
    d = Driver(obs, 1)
    d.insert([1, 2, 3])
    d.insert([5, 6, 7])
    d.match([1, 2, 3, 4], lock=True)
    d.evict(100)
    d.unlock(0)
    d.evict(2)


@case("a match splits a locked edge: both halves stay locked", hint=3)
def split_locked(obs: Obs) -> None:
    d = Driver(obs, 1)
    d.insert([1, 2, 3, 4, 5, 6])
    d.match([1, 2, 3, 4, 5, 6], lock=True)
    d.match([1, 2, 3, 9], lock=False)  # cuts the locked edge after 3 tokens
    d.evict(100)  # nothing is evictable: the whole path is locked
    d.unlock(0)
    d.evict(2)


@case("eviction takes the least recently used leaf first", hint=4)
def lru(obs: Obs) -> None:
    d = Driver(obs, 1)
    d.insert([1, 2])
    d.insert([3, 4])
    d.insert([5, 6])
    d.match([1, 2], lock=False)  # now 3,4 is the oldest
    d.evict(1)
    d.evict(3)


@case("random operation sequences", seeds=4, hint=4)
def random_ops(obs: Obs, seed: int) -> None:
    rng = random.Random(seed)
    d = Driver(obs, rng.choice([1, 1, 2, 4]))
    seqs = [[rng.randrange(1, 6) for _ in range(rng.randint(1, 14))] for _ in range(5)]
    for _ in range(rng.randint(8, 20)):
        op = rng.random()
        base = list(rng.choice(seqs))
        ids = base[: rng.randint(0, len(base))] + [rng.randrange(1, 6) for _ in range(rng.randint(0, 6))]
        if op < 0.4 and len(ids) >= d.ps:
            d.insert(ids)
        elif op < 0.7 and ids:
            d.match(ids, lock=rng.random() < 0.5)
        elif op < 0.85 and d.handles:
            d.unlock(rng.randrange(len(d.handles)))
        else:
            d.evict(rng.randint(1, 12))


@case("tiny-llama: shared prefixes over two rounds through a pool that must evict", kind=E2E, hint=3)
def engine(obs: Obs) -> None:
    prompts = harness.random_prompts(seed=5, n=5, lo=2, hi=10, shared_prefix=9)
    cfg = harness.scheduler_config(num_pages=64, max_running_reqs=3, page_size=2)
    harness.generate(obs, cfg, prompts, SamplingParams(max_tokens=5, ignore_eos=True), rounds=2)
