"""Projection GEMMs at decode row counts, in CUDA graphs, against their weight-read time."""
import torch
from _timing import graph_us
dev = torch.device("cuda"); dt = torch.bfloat16
shapes = {"qkv": (4096, 1024), "o": (1024, 2048), "gate_up": (6144, 1024), "down": (1024, 3072), "lm_head": (151936, 1024)}
W = {k: torch.randn(n, kk, dtype=dt, device=dev) * 0.02 for k, (n, kk) in shapes.items()}
for m in (4, 8, 16, 32, 64, 96, 128, 192, 256):
    row = []
    tot = 0
    for name, w in W.items():
        x = torch.randn(m, w.shape[1], dtype=dt, device=dev)
        us = graph_us(lambda: torch.nn.functional.linear(x, w), inner=28 if name != "lm_head" else 4, reps=20)
        floor = w.numel() * 2 / 4.1e6
        row.append(f"{name} {us:6.1f}/{floor:5.1f}")
        if name != "lm_head": tot += us
    print(f"M={m:4d} " + "  ".join(row) + f"   layer {tot:6.1f} us, x28 {tot*28/1000:.3f} ms", flush=True)
