"""A Qwen3-0.6B layer's four projections through `F.linear` by row count, with the BLAS library
PyTorch is told to prefer (`--blas cublas` or `cublaslt`), 28 distinct weights each (not in L2),
one CUDA graph of 28 calls; microseconds per call against the weight's reading time at 4.1 TB/s.
`python tools/gpu_probes/projections_blas.py --blas cublaslt`"""
import argparse
import torch
import torch.nn.functional as F
from _timing import graph_us

SHAPES = {"qkv": (4096, 1024), "o": (1024, 2048), "gate_up": (6144, 1024), "down": (1024, 3072)}
ap = argparse.ArgumentParser()
ap.add_argument("--blas", default="cublas", choices=("cublas", "cublaslt"))
ap.add_argument("--rows", default="8,32,64,96,128,192,256")
a = ap.parse_args()
torch.backends.cuda.preferred_blas_library(a.blas)
dev, dt = torch.device("cuda"), torch.bfloat16
W = {k: [torch.randn(n, kk, dtype=dt, device=dev) * 0.02 for _ in range(28)] for k, (n, kk) in SHAPES.items()}
for m in [int(r) for r in a.rows.split(",")]:
    row, tot = [], 0.0
    for name, ws in W.items():
        x = torch.randn(m, ws[0].shape[1], dtype=dt, device=dev)
        us = graph_us(lambda: [F.linear(x, w) for w in ws], inner=1, reps=20) / len(ws)
        row.append(f"{name} {us:5.2f}/{ws[0].numel() * 2 / 4.1e6:4.1f}")
        tot += us
    print(f"{a.blas:8s} rows {m:4d}  " + "  ".join(row) + f"   layer {tot:6.2f} us", flush=True)
