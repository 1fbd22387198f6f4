"""The split-K projection kernel (`minisgl.kernel.gemm`) against what a Qwen3-0.6B layer runs today
(cuBLAS through `F.linear`, the norm and SiLU kernels around it), by row count and tile.

Every projection of a layer with its neighbours: QKV after the add+RMSNorm, O, gate/up after the
add+RMSNorm with SiLU after it, down. 28 distinct weights per projection (as in the model, so they do
not stay in L2), one CUDA graph of 28 calls; microseconds per call. Prints, per row count, today's
time and the fastest tiles, and checks each tile's output against today's.
`python tools/gpu_probes/small_gemm_tiles.py [--rows 4,16,64] [--prewarm N]`"""
import argparse, itertools, multiprocessing as mp, sys, time
import torch
import torch.nn.functional as F
from _timing import graph_us
from minisgl.kernel import fused_add_rmsnorm, silu_and_mul
from split_k_gemm import GemmTile, gemm, row_block

LAYERS, EPS = 28, 1e-6
SHAPES = {"qkv": (4096, 1024, False, True), "o": (1024, 2048, False, False),
          "gate_up": (6144, 1024, True, True), "down": (1024, 3072, False, False)}


def tiles(rows, n, k):
    """Candidate tiles for `rows` x `n` outputs (features of the result, not weight rows) over `k`."""
    for bn, bm, bk, split in itertools.product((32, 64, 128), sorted({row_block(rows, c) for c in (32, 64, 128)}), (64, 128), (1, 2, 3, 4, 6, 8, 12, 16)):
        chunk = -(-(-(-k // split)) // bk) * bk
        if chunk * (split - 1) >= k:
            continue
        progs = -(-n // bn) * -(-rows // bm) * split
        if progs > 1100 or (progs < 48 and split < 16):
            continue
        yield GemmTile(bn, bm, bk, split, warps=8 if bn * bm >= 8192 else 4)


def run(name, tile, x, ws, res, nw):
    n, k, silu, norm = SHAPES[name]
    return [gemm(x, w, tile, silu_mul=silu, norm_weight=nw if norm else None, residual=res if norm else None, eps=EPS)[0] for w in ws]


def today(name, x, ws, res, nw):
    n, k, silu, norm = SHAPES[name]
    outs = []
    for w in ws:
        h = fused_add_rmsnorm(x, res, nw, EPS)[0] if norm else x
        y = F.linear(h, w)
        outs.append(silu_and_mul(y) if silu else y)
    return outs


def _warm(args):
    name, tile = args
    n, k, silu, norm = SHAPES[name]
    dev = torch.device("cuda")
    x = torch.randn(tile.bm, k, dtype=torch.bfloat16, device=dev)
    w = torch.randn(n, k, dtype=torch.bfloat16, device=dev)
    nw = torch.ones(k, dtype=torch.bfloat16, device=dev)
    try:
        gemm(x, w, tile, silu_mul=silu, norm_weight=nw if norm else None, residual=x if norm else None, eps=EPS)
        torch.cuda.synchronize()
        return None
    except Exception as e:  # out of shared memory and the like: the sweep skips it
        return f"{name} {tile}: {type(e).__name__}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="3,4,8,16,32,48,64,96,128,160,192,256")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--prewarm", type=int, default=12, help="processes compiling the kernels first (Triton caches them on disk)")
    ap.add_argument("--top", type=int, default=3)
    a = ap.parse_args()
    rows_list = [int(r) for r in a.rows.split(",")]
    names = a.shapes.split(",")
    t0 = time.time()
    if a.prewarm:  # one compilation per (variant, bn, bm, bk, split==1, warps): the row count is not specialised
        keys = {}
        for name in names:
            n, k, silu, norm = SHAPES[name]
            for rows in rows_list:
                for t in tiles(rows, n // 2 if silu else n, k):
                    keys[((silu, norm), t.bn, t.bm, t.bk, t.split == 1, t.warps)] = (name, t)
        with mp.get_context("spawn").Pool(a.prewarm) as pool:
            bad = [r for r in pool.map(_warm, list(keys.values())) if r]
        print(f"compiled {len(keys)} variants in {time.time() - t0:.0f} s; failed: {bad}", flush=True)
    dev = torch.device("cuda")
    torch.manual_seed(0)
    nw = (torch.rand(1024, device=dev) + 0.5).to(torch.bfloat16)
    totals = {}
    for rows in rows_list:
        res = torch.randn(rows, 1024, dtype=torch.bfloat16, device=dev)
        for name in names:
            n, k, silu, norm = SHAPES[name]
            ws = [torch.randn(n, k, dtype=torch.bfloat16, device=dev) * 0.02 for _ in range(LAYERS)]
            x = torch.randn(rows, k, dtype=torch.bfloat16, device=dev)
            want = today(name, x, ws[:1], res, nw)[0].float()
            base = graph_us(lambda: today(name, x, ws, res, nw), inner=1, reps=20) / LAYERS
            found = []
            for t in tiles(rows, n // 2 if silu else n, k):
                try:
                    got = run(name, t, x, ws[:1], res, nw)[0].float()
                except Exception:
                    continue
                err = ((got - want).abs().max() / want.abs().max()).item()
                us = graph_us(lambda: run(name, t, x, ws, res, nw), inner=1, reps=20) / LAYERS
                found.append((us, t, err))
            found.sort(key=lambda f: f[0])
            best = found[0]
            totals.setdefault(rows, [0.0, 0.0])
            totals[rows][0] += base
            totals[rows][1] += min(base, best[0])
            tops = "  ".join(f"{us:5.2f} us bn{t.bn} bm{t.bm} bk{t.bk} s{t.split} w{t.warps} (err {err:.1e})" for us, t, err in found[: a.top])
            print(f"rows {rows:4d} {name:8s} today {base:5.2f} us | {tops}", flush=True)
        b, n_ = totals[rows]
        print(f"rows {rows:4d} layer: today {b:6.2f} us, best of both {n_:6.2f} us ({(b - n_) * LAYERS:5.0f} us a step saved)", flush=True)
    print(f"done in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
