"""The engine's Triton decode kernel (`minisgl.kernel.decode`) at the offline workload's uneven lengths
and 64-256 requests, by tile: keys per inner step, warps, pipeline stages, at two or three splits a request
(its grid in the engine's order, KV heads first). Against FlashInfer's decode over 4 equal pieces per
request plus their merge (the engine's path from 96 requests before the kernel took those batches). The
ninth round also tried one split size for the whole batch (long requests getting more splits); that form
of the kernel is not in the engine and no longer here. `python tools/gpu_probes/decode_triton_sweep.py`"""
import math
import random

import numpy as np
import torch
import flashinfer

from _timing import graph_us
from minisgl.kernel import merge_pieces
from minisgl.kernel.decode import _decode_kernel

dev = torch.device("cuda")
dt = torch.bfloat16
HQ, HKV, D, G = 16, 8, 128, 2


def main() -> None:
    rng = random.Random(0)
    slots = 256 * 1600
    k = torch.randn(slots, HKV, D, dtype=dt, device=dev)
    v = torch.randn_like(k)
    paged = (k.view(-1, 1, HKV, D), v.view(-1, 1, HKV, D))
    ws = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    for bs in (64, 128, 192, 256):
        lens = [rng.randint(100, 1024) + rng.randint(0, 500) for _ in range(bs)]
        q = torch.randn(bs, HQ, D, dtype=dt, device=dev)
        perm = torch.randperm(slots, device=dev)[: sum(lens)].to(torch.int32)
        table = torch.zeros(bs, 2048, dtype=torch.int32, device=dev)
        at = 0
        for i, L in enumerate(lens):
            table[i, :L] = perm[at : at + L]
            at += L
        kvl = torch.tensor(lens, dtype=torch.int32, device=dev)
        rows = torch.arange(bs, dtype=torch.int32, device=dev)
        nbytes = sum(lens) * HKV * D * 4
        # reference: FlashInfer over 4 equal pieces + merge (the engine's path from 96 requests)
        counts = [4] * bs
        sizes = []
        for L in lens:
            sizes += [(j + 1) * L // 4 - j * L // 4 for j in range(4)]
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_cuda_graph=True,
            paged_kv_indptr_buffer=torch.zeros(4 * bs + 1, dtype=torch.int32, device=dev),
            paged_kv_indices_buffer=torch.zeros(len(perm), dtype=torch.int32, device=dev),
            paged_kv_last_page_len_buffer=torch.ones(4 * bs, dtype=torch.int32, device=dev))
        w.plan(torch.tensor([0, *np.cumsum(sizes)], dtype=torch.int32), perm, torch.ones(4 * bs, dtype=torch.int32), HQ, HKV, D, 1, q_data_type=dt, kv_data_type=dt)
        own = torch.arange(bs, device=dev).repeat_interleave(4).to(torch.int32)
        start = torch.arange(0, 4 * bs + 1, 4, dtype=torch.int32, device=dev)
        def fi():
            o, lse = w.run(q.index_select(0, own), paged, return_lse=True)
            return merge_pieces(o, lse, start)
        ref = fi().float()
        fi_us = graph_us(fi)
        cells = [f"FI 4 pieces {fi_us:.1f} us {nbytes / fi_us / 1e6:.2f} TB/s"]
        best = []
        for per in (2, 3):
            for BT in (32, 64, 128):
                for warps in (4, 8):
                    for stages in (2, 3, 4):
                        splits, grid = per, (HKV, bs, per)
                        part = torch.empty(bs * HKV * splits * 2 * D, dtype=torch.float32, device=dev)
                        ml = torch.empty(bs * HKV * splits * 2 * 2, dtype=torch.float32, device=dev)
                        cnt = torch.zeros(bs * HKV, dtype=torch.int32, device=dev)
                        out = torch.empty_like(q)
                        def fn(BT=BT, warps=warps, stages=stages, splits=splits, grid=grid, part=part, ml=ml, cnt=cnt, out=out):
                            _decode_kernel[grid](q, k, v, table, rows, kvl, part, ml, cnt, out, table.stride(0), k.stride(0), v.stride(0), 1 / math.sqrt(D),
                                                 HKV=HKV, G=G, GP=16, GR=2, D=D, SPLITS=splits, BT=BT, HEADS_FIRST=True, num_warps=warps, num_stages=stages)
                            return out
                        try:
                            r = fn().float()
                            err = (r - ref).abs().max().item()
                            us = graph_us(fn)
                        except Exception as e:  # a tile that does not compile or fit
                            print(f"  bs {bs} {per} BT {BT} w {warps} st {stages}: {type(e).__name__} {str(e)[:80]}", flush=True)
                            continue
                        best.append((us, f"splits {per} BT{BT} w{warps} st{stages}", err))
        best.sort()
        cells += [f"{name} {us:.1f} us {nbytes / us / 1e6:.2f} TB/s err {err:.0e}" for us, name, err in best[:6]]
        # the engine's large-batch tile (two splits, 128 keys a step, 4 warps, 2 stages) for reference
        cur = [b for b in best if b[1] == "splits 2 BT128 w4 st2"]
        cells += [f"[current {name}: {us:.1f} us]" for us, name, _ in cur]
        print(f"bs {bs} ({sum(lens) // bs} keys avg): " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
