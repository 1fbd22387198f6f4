"""Decode attention variants at offline-like shapes, page size 1 (one layer's pool): FlashInfer's
CUDA-core decode, tensor-core decode (fa2, fa3), three orders of the slots.  GPU only:
    python tools/gpu_probes/decode_attention_variants.py
(The "nosplit" rows pass `disable_split_kv`, which the CUDA-core planner ignores: they repeat the first.)"""
import time, torch, flashinfer, sys
from _timing import graph_us
torch.manual_seed(0)
dev = torch.device("cuda")
HQ, HKV, D = 16, 8, 128
dt = torch.bfloat16
SLOTS = 256 * 1200 + 4096
k = torch.randn(SLOTS, HKV, D, dtype=dt, device=dev)
v = torch.randn(SLOTS, HKV, D, dtype=dt, device=dev)
ws = torch.empty(256 << 20, dtype=torch.uint8, device=dev)

def layout(bs, n, kind, gen_frac=0.4):
    g = int(n * gen_frac); p = n - g
    if kind == "contig":
        idx = torch.arange(bs * n).view(bs, n)
    elif kind == "alloc":  # prompt runs, then decode tokens interleaved across requests
        pr = torch.arange(bs * p).view(bs, p)
        gen = bs * p + torch.arange(g * bs).view(g, bs).t()
        idx = torch.cat([pr, gen], 1)
    else:
        idx = torch.randperm(bs * n)[: bs * n].view(bs, n)
    return idx.to(torch.int32).flatten().to(dev)


def variants():
    yield "cuda-core", dict(use_tensor_cores=False), {}
    yield "cuda-core nosplit", dict(use_tensor_cores=False), dict(disable_split_kv=True)
    yield "tc fa2", dict(use_tensor_cores=True), {}
    yield "tc fa3", dict(use_tensor_cores=True, backend="fa3"), {}

shapes = [(256, 550), (256, 1100), (128, 900), (64, 1200), (32, 1500), (16, 1500)]
for bs, n in shapes:
    nbytes = bs * n * HKV * D * 2 * 2
    q = torch.randn(bs, HQ, D, dtype=dt, device=dev)
    indptr = torch.arange(0, bs * n + 1, n, dtype=torch.int32)
    last = torch.ones(bs, dtype=torch.int32)
    for kind in ("alloc", "contig", "random"):
        idx = layout(bs, n, kind)
        ref = None
        for name, ctor, pl in variants():
            try:
                w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", **ctor)
                t0 = time.perf_counter()
                for _ in range(5):
                    w.plan(indptr, idx, last, HQ, HKV, D, 1, q_data_type=dt, kv_data_type=dt, **pl)
                plan_us = (time.perf_counter() - t0) / 5 * 1e6
                kv = (k.view(-1, 1, HKV, D), v.view(-1, 1, HKV, D))
                out = w.run(q, kv)
                if ref is None: ref = out
                err = (out.float() - ref.float()).abs().max().item()
                us = graph_us(lambda: w.run(q, kv))
                print(f"{bs:4d} x {n:5d} {kind:7s} {name:18s} {us:8.1f} us  {nbytes / us / 1e6:5.2f} TB/s  plan {plan_us:7.0f} us  err {err:.3g}", flush=True)
            except Exception as e:
                print(f"{bs:4d} x {n:5d} {kind:7s} {name:18s} FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
src = torch.empty(2 << 30, dtype=torch.uint8, device=dev); dst = torch.empty_like(src)
us = graph_us(lambda: dst.copy_(src), reps=10)
print(f"copy: {2 * src.numel() / us / 1e6:.2f} TB/s")
