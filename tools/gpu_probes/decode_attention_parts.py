"""Each request's keys as P virtual requests (FlashInfer graph-mode decode), then one merge kernel."""
import random, torch, flashinfer, triton, triton.language as tl
from _timing import graph_us
dev = torch.device("cuda"); dt = torch.bfloat16
HQ, HKV, D = 16, 8, 128

@triton.jit
def _merge(o_ptr, lse_ptr, out_ptr, P: tl.constexpr, HQ: tl.constexpr, D: tl.constexpr):
    r = tl.program_id(0); h = tl.program_id(1)
    d = tl.arange(0, D)
    m = -float("inf")
    for p in range(P):
        m = tl.maximum(m, tl.load(lse_ptr + (r * P + p) * HQ + h))
    acc = tl.zeros([D], dtype=tl.float32); den = 0.0
    for p in range(P):
        s = tl.load(lse_ptr + (r * P + p) * HQ + h)
        w = tl.exp2(s - m)  # FlashInfer's lse is in base 2
        acc += w * tl.load(o_ptr + ((r * P + p) * HQ + h) * D + d).to(tl.float32)
        den += w
    tl.store(out_ptr + (r * HQ + h) * D + d, (acc / den).to(out_ptr.dtype.element_ty))


rng = random.Random(0)
SLOTS = 256 * 1600
k = torch.randn(SLOTS, 1, HKV, D, dtype=dt, device=dev); v = torch.randn_like(k)
for bs in (64, 96, 128, 160, 192, 224, 256):
    lens = [rng.randint(100, 1024) + rng.randint(0, 500) for _ in range(bs)]
    q = torch.randn(bs, HQ, D, dtype=dt, device=dev)
    idx = torch.randperm(SLOTS, device=dev)[: sum(lens)].to(torch.int32)
    nbytes = sum(lens) * HKV * D * 4
    res = []
    ref = None
    for P in (1, 2, 3, 4):
        vl = []
        for L in lens:
            c = -(-L // P)
            vl += [min(c, L - i * c) for i in range(P)]
        assert all(x > 0 for x in vl)
        vb = len(vl)
        indptr = torch.tensor([0] + list(__import__("itertools").accumulate(vl)), dtype=torch.int32)
        last = torch.ones(vb, dtype=torch.int32)
        ws = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_cuda_graph=True,
            paged_kv_indptr_buffer=torch.zeros(vb + 1, dtype=torch.int32, device=dev),
            paged_kv_indices_buffer=torch.zeros(SLOTS, dtype=torch.int32, device=dev),
            paged_kv_last_page_len_buffer=torch.ones(vb, dtype=torch.int32, device=dev))
        w.plan(indptr, idx, last, HQ, HKV, D, 1, q_data_type=dt, kv_data_type=dt)
        out = torch.empty(bs, HQ, D, dtype=dt, device=dev)
        if P == 1:
            fn = lambda: w.run(q, (k, v))
        else:
            def fn(w=w, P=P, out=out):
                qq = q.unsqueeze(1).expand(bs, P, HQ, D).reshape(bs * P, HQ, D)
                o, lse = w.run(qq, (k, v), return_lse=True)
                _merge[(bs, HQ)](o, lse, out, P, HQ, D)
                return out
        r = fn()
        if ref is None: ref = r.clone()
        err = (r.float() - ref.float()).abs().max().item()
        us = graph_us(fn)
        res.append(f"P={P}: {us:6.1f} us {nbytes/us/1e6:.2f} TB/s err {err:.1e}")
        del ws
    print(f"bs {bs:3d} ({sum(lens)//bs} keys avg): " + " | ".join(res), flush=True)
