"""Cases for store-kv-kernel: stores into small pools from strided and contiguous inputs with
int32 and int64 slots, checked row by row (and that nothing else moved), random differential
cases, and tiny-llama generating with every KV write going through your store_kv."""

import random

import torch

from judge import harness
from judge.api import E2E, Obs, case, snapshot


def _qkv_views(gen, tokens: int, q_heads: int, kv_heads: int, dim: int, dtype):
    """k and v as the attention layer makes them: column slices of the merged qkv output."""
    qkv = torch.randn(tokens, (q_heads + 2 * kv_heads) * dim, generator=gen).to(dtype)
    _, k, v = qkv.split([q_heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    return k.view(tokens, kv_heads, dim), v.view(tokens, kv_heads, dim)


def _store(obs: Obs, fn_name: str, tag: str, k, v, slots: int, out_loc, dtype) -> None:
    from minisgl.kernel import store

    dev = harness.device()
    k, v, out_loc = k.to(dev), v.to(dev), out_loc.to(dev)
    k_cache = torch.full((slots, *k.shape[1:]), -1.0, dtype=dtype, device=dev)
    v_cache = torch.full((slots, *k.shape[1:]), -2.0, dtype=dtype, device=dev)
    k_ptr, v_ptr = k_cache.data_ptr(), v_cache.data_ptr()
    before = snapshot((k, v, out_loc))
    getattr(store, fn_name)(k, v, k_cache, v_cache, out_loc)
    obs.unchanged(f"{tag}: the inputs k, v, out_loc", before, (k, v, out_loc))
    obs.eq(f"{tag}: the caches were written in place (same storage)", [k_cache.data_ptr() == k_ptr, v_cache.data_ptr() == v_ptr])
    loc = out_loc.long().cpu()
    kc, vc = k_cache.float().cpu(), v_cache.float().cpu()
    written = sorted(set(loc.tolist()))
    untouched = [s for s in range(slots) if s not in written]
    obs.eq(f"{tag}: slots left untouched keep their old values", bool((kc[untouched] == -1).all() and (vc[untouched] == -2).all()))
    obs.eq(f"{tag}: k_cache[out_loc[i]] == k[i] for every token", [bool(torch.equal(kc[s], k[i].float().cpu())) for i, s in enumerate(loc.tolist())])
    obs.eq(f"{tag}: v_cache[out_loc[i]] == v[i] for every token", [bool(torch.equal(vc[s], v[i].float().cpu())) for i, s in enumerate(loc.tolist())])
    obs.close(f"{tag}: k_cache", kc)
    obs.close(f"{tag}: v_cache", vc)


@case("store_kv_ref: three tokens, contiguous inputs, int64 slots", hint=1)
def ref_basic(obs: Obs) -> None:
    gen = torch.Generator().manual_seed(0)
    k, v = torch.randn(3, 2, 4, generator=gen), torch.randn(3, 2, 4, generator=gen)
    _store(obs, "store_kv_ref", "3 tokens", k, v, 8, torch.tensor([6, 1, 3]), torch.float32)


@case("store_kv_ref: int32 slots, as the scheduler makes them", hint=2)
def ref_int32(obs: Obs) -> None:
    gen = torch.Generator().manual_seed(1)
    k, v = torch.randn(4, 2, 4, generator=gen), torch.randn(4, 2, 4, generator=gen)
    _store(obs, "store_kv_ref", "int32 slots", k, v, 12, torch.tensor([11, 0, 5, 4], dtype=torch.int32), torch.float32)


@case("store_kv: strided k and v sliced out of a qkv output", hint=3)
def strided(obs: Obs) -> None:
    gen = torch.Generator().manual_seed(2)
    k, v = _qkv_views(gen, 5, 4, 2, 8, torch.float32)
    obs.eq("the inputs really are strided", [k.is_contiguous(), v.is_contiguous()])
    _store(obs, "store_kv", "strided views", k, v, 16, torch.tensor([3, 9, 4, 15, 0], dtype=torch.int32), torch.float32)


@case("store_kv: bfloat16 pool, one token (a decode step of one request)", hint=3)
def bf16_one(obs: Obs) -> None:
    gen = torch.Generator().manual_seed(3)
    k, v = _qkv_views(gen, 1, 2, 1, 16, torch.bfloat16)
    _store(obs, "store_kv", "bfloat16, one token", k, v, 4, torch.tensor([2], dtype=torch.int32), torch.bfloat16)


@case("store_kv: zero tokens writes nothing", hint=4)
def empty(obs: Obs) -> None:
    k = torch.zeros(0, 2, 4)
    _store(obs, "store_kv", "zero tokens", k, k.clone(), 4, torch.zeros(0, dtype=torch.int32), torch.float32)


@case("random shapes, dtypes and slot choices", seeds=4, hint=3)
def random_stores(obs: Obs, seed: int) -> None:
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    for j in range(3):
        kvh, dim = rng.choice([1, 2, 4]), rng.choice([4, 8, 16])
        tokens, slots = rng.randint(1, 12), rng.randint(12, 40)
        dtype = rng.choice([torch.float32, torch.bfloat16])
        k, v = _qkv_views(gen, tokens, kvh * rng.choice([1, 2]), kvh, dim, dtype)
        loc = torch.tensor(rng.sample(range(slots), tokens), dtype=rng.choice([torch.int32, torch.int64]))
        _store(obs, "store_kv", f"store {j}: {tokens} tokens, {kvh}x{dim}, {str(dtype)[6:]}, {slots} slots", k, v, slots, loc, dtype)


@case("tiny-llama generates with every KV write going through your store_kv", kind=E2E, hint=3, timeout_s=120)
def engine_run(obs: Obs) -> None:
    from minisgl.core import SamplingParams
    from minisgl.kernel import store

    cfg = harness.scheduler_config("tiny-llama", page_size=4, num_pages=128)
    sched = harness.make_scheduler(cfg)
    pool = sched.engine.kv_cache
    calls = {"n": 0}

    def store_through_kernel(k, v, out_loc, layer):  # the pool's write, routed through store_kv
        calls["n"] += 1
        store.store_kv(k, v, pool.k_cache(layer), pool.v_cache(layer), out_loc)

    pool.store_kv = store_through_kernel
    prompts = harness.random_prompts(5, 3, lo=3, hi=10) + [[42, 43, 44, 45, 46, 47]]
    uids = [sched.add_request(p, SamplingParams(max_tokens=5, ignore_eos=True)) for p in prompts]
    harness.run_until_idle(sched)
    for i, u in enumerate(uids):
        obs.eq(f"request {i}: generated token ids", sched.outputs[u].tokens)
    obs.eq("your store_kv was called for every layer of every step", calls["n"] == len(sched.trace) * sched.engine.model_config.num_layers)
