"""Can the projections after a decode step's attention read their weights from L2 instead of memory?

28 layers of Qwen3-0.6B's projections (distinct weights, laid out in one allocation in the order they run:
QKV, O, gate/up, down of layer 0, then layer 1, ...) around the engine's Triton decode attention at the
offline workload's lengths, in a CUDA graph. Per layer: attention, O, gate/up with SiLU, down, the next QKV
(the engine's `kernel.linear` dispatch). Variants, microseconds per 28-layer pass:

- plain: as the engine runs today;
- side-loads N: a kernel on a second stream, forked before the attention and joined before O, loads the
  weights the attention is followed by (this layer's O, gate/up, down and the next QKV) with
  evict_last, from N programs;
- side-bulk: the same range asked for with Hopper's bulk L2 prefetch (one instruction per 64 KB);
- after-loads: the loads on the main stream after the attention (what the projections gain from L2 at
  the price of a serial read).
`python tools/gpu_probes/weights_in_l2.py`"""
import sys

import torch
import triton
import triton.language as tl

from _timing import graph_us
from decode_head_order import case
from minisgl import kernel
from minisgl.kernel import LARGE_BATCH_BLOCK, LARGE_BATCH_STAGES, DecodeScratch, decode_attention, decode_splits

dev = torch.device("cuda")
dt = torch.bfloat16
HQ, HKV, D, HID, INTER, LAYERS = 16, 8, 128, 1024, 3072, 28
SHAPES = [(HQ * D + 2 * HKV * D, HID), (HID, HQ * D), (2 * INTER, HID), (HID, INTER)]  # qkv, o, gate_up, down


@triton.jit
def _load_kernel(ptr, sink, n, BLOCK: tl.constexpr, EACH: tl.constexpr):
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(EACH):
        off = (pid * EACH + i) * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(ptr + off, mask=off < n, other=0.0, eviction_policy="evict_last").to(tl.float32)
    tot = tl.sum(acc)
    tl.store(sink + pid, tot, mask=tot == 1234.5678)  # keeps the loads; never true in practice


@triton.jit
def _bulk_kernel(ptr, sink, n_chunks, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    c = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    addr = ptr + c.to(tl.int64) * (CHUNK // 2)  # bf16 elements
    r = tl.inline_asm_elementwise(f"cp.async.bulk.prefetch.L2.global [$1], {CHUNK}; mov.u32 $0, 0;", "=r,l",
                                  [addr], dtype=tl.int32, is_pure=False, pack=1)
    tl.store(sink + c, r, mask=(c < n_chunks) & (r == 77))


def side_loads(buf: torch.Tensor, sink: torch.Tensor, progs: int) -> None:
    n = buf.numel()
    block = 4096
    each = triton.cdiv(triton.cdiv(n, block), progs)
    _load_kernel[(progs,)](buf, sink, n, BLOCK=block, EACH=each, num_warps=8)


def side_bulk(buf: torch.Tensor, sink: torch.Tensor) -> None:
    chunk = 65536
    n = buf.numel() * 2 // chunk  # whole chunks (the tail is left to memory)
    _bulk_kernel[(triton.cdiv(n, 128),)](buf, sink, n, CHUNK=chunk, BLOCK=128, num_warps=4)


def main() -> None:
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    sizes = [a * b for a, b in SHAPES]
    per_layer = sum(sizes)
    flat = torch.randn(per_layer * (LAYERS + 1), dtype=dt, device=dev) * 0.02
    layers = []
    for i in range(LAYERS + 1):
        at, ws = i * per_layer, []
        for (a, b), n in zip(SHAPES, sizes):
            ws.append(flat[at : at + n].view(a, b))
            at += n
        layers.append(ws)
    # the range after layer i's attention: its O, gate/up, down, then layer i+1's QKV
    after = [flat[i * per_layer + sizes[0] : (i + 1) * per_layer + sizes[0]] for i in range(LAYERS)]
    sink = torch.zeros(1 << 16, device=dev)
    side = torch.cuda.Stream()
    for bs in [int(a) for a in (sys.argv[1].split(",") if len(sys.argv) > 1 else "1,16,64,128,256".split(","))]:
        lens, table, slots = case(bs, "engine", __import__("random").Random(bs))
        k = torch.randn(slots, HKV, D, dtype=dt, device=dev)
        v = torch.randn_like(k)
        rows = torch.arange(bs, dtype=torch.int32, device=dev)
        kvl = torch.tensor(lens, dtype=torch.int32, device=dev)
        large = bs >= 64
        splits = 2 if large else max(decode_splits(bs, HKV, sms), 2)
        tile = dict(block=LARGE_BATCH_BLOCK, stages=LARGE_BATCH_STAGES) if large else {}
        scratch = DecodeScratch.for_batches(bs, HKV, HQ // HKV, D, sms, dev, pieces=bs * 64, rows=bs)
        x0 = torch.randn(bs, HID, dtype=dt, device=dev)

        def run(pre=None, where="side"):
            qkv = kernel.linear(x0, layers[0][0])
            for i in range(LAYERS):
                q = qkv[:, : HQ * D].reshape(bs, HQ, D).contiguous()
                if pre is not None and where == "side":
                    side.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(side):
                        pre(after[i])
                a = decode_attention(q, k, v, table, rows, kvl, scratch, splits, **tile).view(bs, HQ * D)
                if pre is not None and where == "side":
                    torch.cuda.current_stream().wait_stream(side)
                elif pre is not None:
                    pre(after[i])
                o = kernel.linear(a, layers[i][1])
                h = kernel.linear_silu_and_mul(o, layers[i][2])
                d = kernel.linear(h, layers[i][3])
                qkv = kernel.linear(d, layers[i + 1][0])
            return qkv

        variants = [("plain", dict())]
        for progs in (16, 66, 132):
            variants.append((f"side-loads {progs}", dict(pre=lambda b, p=progs: side_loads(b, sink, p))))
        variants.append(("side-bulk", dict(pre=lambda b: side_bulk(b, sink))))
        variants.append(("after-loads 132", dict(pre=lambda b: side_loads(b, sink, 132), where="after")))
        ref = run().clone()
        cells = []
        for name, kw in variants:
            try:
                out = run(**kw)
                torch.cuda.synchronize()
                same = torch.equal(out, ref)
                us = graph_us(lambda kw=kw: run(**kw), inner=1, reps=20)
                cells.append(f"{name} {us:.0f}{'' if same else ' (output differs!)'}")
            except Exception as e:  # a variant that does not compile here
                cells.append(f"{name}: {type(e).__name__} {str(e)[:120]}")
        print(f"bs {bs} ({sum(lens) // bs} keys avg), us per 28 layers: " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
