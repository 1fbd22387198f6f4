"""The engine's Triton decode kernel with its grid in either order: (request, KV head, split), one head's
256 bytes of a slot read at a time, or (KV head, request, split), a slot's eight heads read by neighbouring
programs. At the engine's tiles (the small-batch tile and `decode_splits` up to 4 requests, the large-batch
tile and two splits from 64) and the offline workload's lengths, for two slot layouts: every key in a random
slot, and the engine's (each prompt in one run of slots, each generated token one slot further along a
stride of the batch size). Both orders' outputs must be identical. At 16 and 32 requests (FlashInfer's
today) it also tries two and four splits at both tiles, against FlashInfer's decode of whole requests.
`python tools/gpu_probes/decode_head_order.py`"""
import random

import flashinfer
import torch

from _timing import graph_us
from minisgl.kernel import LARGE_BATCH_BLOCK, LARGE_BATCH_STAGES, DecodeScratch, PendingRope, decode_attention, decode_splits
from minisgl.layers.rotary import RotaryEmbedding

dev = torch.device("cuda")
dt = torch.bfloat16
HQ, HKV, D = 16, 8, 128


def case(bs: int, layout: str, rng: random.Random):
    prompts = [rng.randint(100, 1024) for _ in range(bs)]
    gen = [rng.randint(0, 500) for _ in range(bs)]
    lens = [p + g for p, g in zip(prompts, gen)]
    table = torch.zeros(bs, 2048, dtype=torch.int32)
    if layout == "random":
        perm = torch.randperm(sum(lens), generator=torch.Generator().manual_seed(bs)).to(torch.int32)
        at = 0
        for i, n in enumerate(lens):
            table[i, :n] = perm[at : at + n]
            at += n
    else:  # prompts in runs, then generated tokens one step (bs slots) apart
        at = 0
        for i, p in enumerate(prompts):
            table[i, :p] = torch.arange(at, at + p, dtype=torch.int32)
            at += p
        for i, g in enumerate(gen):
            table[i, prompts[i] : prompts[i] + g] = at + i + bs * torch.arange(g, dtype=torch.int32)
        at += bs * max(gen)
    return lens, table.to(dev), max(at, sum(lens))


def batch(bs: int, layout: str, rng: random.Random):
    """`case` on the GPU with random caches and queries: key counts, page table, k and v caches, q, rows and key
    counts as int32 tensors."""
    lens, table, slots = case(bs, layout, rng)
    k = torch.randn(slots, HKV, D, dtype=dt, device=dev)
    v = torch.randn_like(k)
    q = torch.randn(bs, HQ, D, dtype=dt, device=dev)
    return lens, table, k, v, q, torch.arange(bs, dtype=torch.int32, device=dev), torch.tensor(lens, dtype=torch.int32, device=dev)


def qk_rope():
    """Rotation tables and Qwen3-style qk-norm weights (random) for `rotating_batch`."""
    rope = RotaryEmbedding(D, 4096, 1e6, None, dev)
    return rope, (torch.randn(D, dtype=dt, device=dev), torch.randn(D, dtype=dt, device=dev), 1e-6)


def rotating_batch(bs: int, rng: random.Random, rope, norm):
    """`case` in the engine's layout as a decode layer sees it before RoPE: q, k and v unrotated views of one
    projection output, and the pending rotation that stores each request's new key and value at its last
    position. Returns key counts, page table, k and v caches, q, rows and key counts as int32 tensors, and
    the `PendingRope`."""
    lens, table, slots = case(bs, "engine", rng)
    kc = torch.randn(slots, HKV, D, dtype=dt, device=dev)
    vc = torch.randn_like(kc)
    qkv = torch.randn(bs, (HQ + 2 * HKV) * D, dtype=dt, device=dev)
    q, k, v = (t.view(bs, -1, D) for t in qkv.split([HQ * D, HKV * D, HKV * D], dim=-1))
    rows = torch.arange(bs, dtype=torch.int32, device=dev)
    kvl = torch.tensor(lens, dtype=torch.int32, device=dev)
    pending = PendingRope((kvl - 1).long(), k, v, table[rows.long(), kvl.long() - 1].long(), rope._cos, rope._sin, norm)
    return lens, table, kc, vc, q, rows, kvl, pending


def flashinfer_wrapper(table, lens):
    """FlashInfer's decode wrapper for whole requests (page size 1), planned for CUDA graphs as the engine plans it."""
    bs = len(lens)
    indices = torch.cat([table[i, :n] for i, n in enumerate(lens)])
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(torch.empty(256 << 20, dtype=torch.uint8, device=dev), "NHD", use_cuda_graph=True,
        paged_kv_indptr_buffer=torch.zeros(bs + 1, dtype=torch.int32, device=dev), paged_kv_indices_buffer=torch.zeros(len(indices), dtype=torch.int32, device=dev),
        paged_kv_last_page_len_buffer=torch.ones(bs, dtype=torch.int32, device=dev))
    indptr = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    w.plan(indptr, indices, torch.ones(bs, dtype=torch.int32), HQ, HKV, D, 1, q_data_type=dt, kv_data_type=dt)
    return w


def flashinfer_us(q, k, v, table, lens) -> float:
    """FlashInfer's decode of whole requests, timed."""
    w = flashinfer_wrapper(table, lens)
    paged = (k.view(-1, 1, HKV, D), v.view(-1, 1, HKV, D))
    return graph_us(lambda: w.run(q, paged))


def main() -> None:
    rng = random.Random(0)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    for layout in ("random", "engine"):
        for bs in (1, 4, 16, 32, 64, 128, 192, 256):
            lens, table, k, v, q, rows, kvl = batch(bs, layout, rng)
            large_tile = dict(block=LARGE_BATCH_BLOCK, stages=LARGE_BATCH_STAGES)
            if bs >= 64:
                setups = [(2, "large", large_tile)]
            elif bs > 4:
                setups = [(sp, name, t) for sp in (2, 4) for name, t in (("large", large_tile), ("small", {}))]
            else:
                setups = [(decode_splits(bs, HKV, sms), "small", {})]
            scratch = DecodeScratch.for_batches(bs, HKV, HQ // HKV, D, sms, dev, pieces=bs * 64, rows=bs)
            nbytes = sum(lens) * HKV * D * 2 * 2
            head = f"{layout:6} bs {bs:3} ({sum(lens) // bs} keys avg)"
            if 4 < bs <= 64:
                fi = flashinfer_us(q, k, v, table, lens)
                print(f"{head}: FlashInfer whole {fi:.1f} us {nbytes / fi / 1e6:.2f} TB/s", flush=True)
            for splits, name, tile in setups:
                outs, cells = {}, []
                for heads_first in (False, True):
                    fn = lambda hf=heads_first: decode_attention(q, k, v, table, rows, kvl, scratch, splits, heads_first=hf, **tile)
                    outs[heads_first] = fn().clone()
                    us = graph_us(fn)
                    cells.append(f"{'heads first' if heads_first else 'requests first'} {us:.1f} us {nbytes / us / 1e6:.2f} TB/s")
                same = torch.equal(outs[False], outs[True])
                print(f"{head}, {splits} splits, {name} tile: " + " | ".join(cells) + f" | identical {same}", flush=True)


if __name__ == "__main__":
    main()
