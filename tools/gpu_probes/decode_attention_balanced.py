"""Decode attention at the offline workload's uneven lengths, per layer: FlashInfer over whole requests,
over each request cut into DECODE_PIECES equal pieces (the engine's default from 96 requests), over pieces
of one common size (a budget of virtual requests shared by all requests, so long requests get more of
them), and the engine's own Triton kernel; plus the card's read-only bandwidth next to its copy rate.
`python tools/gpu_probes/decode_attention_balanced.py`"""
import math
import random

import numpy as np
import torch
import flashinfer

from _timing import graph_us
from minisgl.kernel import DecodeScratch, decode_attention, merge_pieces

dev = torch.device("cuda")
dt = torch.bfloat16
HQ, HKV, D = 16, 8, 128


def bandwidths() -> None:
    n = 4 << 30
    x = torch.empty(n // 2, dtype=dt, device=dev).normal_()
    y = torch.empty_like(x)
    cp = graph_us(lambda: y.copy_(x), inner=1, reps=10)
    rd = graph_us(lambda: x.view(-1, 4096).sum(dim=0, dtype=torch.float32), inner=1, reps=10)
    print(f"copy {2 * n / cp / 1e6:.2f} TB/s (read + write); read-only column sum {n / rd / 1e6:.2f} TB/s", flush=True)
    del x, y
    torch.cuda.empty_cache()


def equal_pieces(lens, p):
    counts = [min(p, L) for L in lens]
    sizes = []
    for L, c in zip(lens, counts):
        sizes += [(j + 1) * L // c - j * L // c for j in range(c)]
    return counts, sizes


def common_size_pieces(lens, budget):
    """Pieces of at most C keys, C chosen so that the pieces fit `budget` virtual requests."""
    bs, total = len(lens), sum(lens)
    c = max(1, -(-total // max(budget - bs, 1)))
    counts = [-(-L // c) for L in lens]
    sizes = []
    for L, k in zip(lens, counts):
        sizes += [(j + 1) * L // k - j * L // k for j in range(k)]
    assert len(sizes) <= budget
    return counts, sizes


def main() -> None:
    bandwidths()
    rng = random.Random(0)
    slots = 256 * 1600
    k = torch.randn(slots, HKV, D, dtype=dt, device=dev)
    v = torch.randn_like(k)
    paged = (k.view(-1, 1, HKV, D), v.view(-1, 1, HKV, D))
    ws = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    for bs in (16, 32, 64, 96, 128, 160, 192, 256):
        lens = [rng.randint(100, 1024) + rng.randint(0, 500) for _ in range(bs)]
        q = torch.randn(bs, HQ, D, dtype=dt, device=dev)
        perm = torch.randperm(slots, device=dev)[: sum(lens)].to(torch.int32)
        table = torch.zeros(bs, 2048, dtype=torch.int32, device=dev)
        at = 0
        for i, L in enumerate(lens):
            table[i, :L] = perm[at : at + L]
            at += L
        rows = torch.arange(bs, dtype=torch.int32, device=dev)
        kvl = torch.tensor(lens, dtype=torch.int32, device=dev)
        nbytes = sum(lens) * HKV * D * 4
        res, ref = [], None

        def fi(counts, sizes, fill_to):
            n = len(sizes)
            sizes = sizes + [1] * (fill_to - n)
            owner = np.repeat(np.arange(bs), counts).tolist() + [0] * (fill_to - n)
            idx = torch.cat([perm, torch.zeros(fill_to - n, dtype=torch.int32, device=dev)])
            indptr = torch.tensor([0, *np.cumsum(sizes)], dtype=torch.int32)
            w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_cuda_graph=True,
                paged_kv_indptr_buffer=torch.zeros(fill_to + 1, dtype=torch.int32, device=dev),
                paged_kv_indices_buffer=torch.zeros(len(idx), dtype=torch.int32, device=dev),
                paged_kv_last_page_len_buffer=torch.ones(fill_to, dtype=torch.int32, device=dev))
            w.plan(indptr, idx, torch.ones(fill_to, dtype=torch.int32), HQ, HKV, D, 1, q_data_type=dt, kv_data_type=dt)
            if fill_to == bs and n == bs:
                return lambda: w.run(q, paged)
            own = torch.tensor(owner, dtype=torch.int32, device=dev)
            start = torch.tensor([0, *np.cumsum(counts)], dtype=torch.int32, device=dev)
            def run():
                o, lse = w.run(q.index_select(0, own), paged, return_lse=True)
                return merge_pieces(o, lse, start)
            return run

        variants = [("FI whole", fi([1] * bs, list(lens), bs)),
                    ("FI 4 equal", fi(*equal_pieces(lens, 4), 4 * bs))]
        for b in (2, 3, 4, 6, 8):
            variants.append((f"FI common x{b}", fi(*common_size_pieces(lens, b * bs), b * bs)))
        for splits in (1, 2, 4):
            sc = DecodeScratch(torch.empty(bs * splits * HKV * 2 * D, dtype=torch.float32, device=dev),
                               torch.empty(bs * splits * HKV * 2 * 2, dtype=torch.float32, device=dev),
                               torch.zeros(bs * HKV, dtype=torch.int32, device=dev))
            variants.append((f"triton s{splits}", lambda sc=sc, s=splits: decode_attention(q, k, v, table, rows, kvl, sc, s)))
        for name, fn in variants:
            r = fn()
            if ref is None:
                ref = r.float().clone()
            err = (r.float() - ref).abs().max().item()
            us = graph_us(fn)
            res.append(f"{name} {us:6.1f} us {nbytes / us / 1e6:.2f} TB/s{'' if err < 2e-2 else f' ERR {err:.1e}'}")
        print(f"bs {bs:3d} ({sum(lens) // bs} keys avg): " + " | ".join(res), flush=True)


if __name__ == "__main__":
    main()
