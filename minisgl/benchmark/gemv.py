"""Projections of a few rows: cuBLAS (`F.linear`) against the matrix-vector kernel (`minisgl.kernel.gemv`).

The four projections of every layer of a model (Qwen3-0.6B's shapes by default), each layer with
its own weights so that none stays in the L2 cache, captured in one CUDA graph per version and
replayed: the time of one decode step's projections, for each row count. The gate/up projection
runs as the engine runs it: with the kernel, SiLU and the product in the same launch. CUDA only.

    python -m minisgl.benchmark.gemv                  # rows 1-4, 28 layers, bfloat16
    python -m minisgl.benchmark.gemv --rows 1,2,8 --layers 4
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from minisgl.kernel import gemv
from minisgl.kernel.activation import silu_and_mul

from .moe import as_graph

# (out features, in features) of Qwen3-0.6B's projections; gate_up is [gate; up]
QWEN3_0_6B = {"qkv_proj": (4096, 1024), "o_proj": (1024, 2048), "gate_up_proj": (6144, 1024), "down_proj": (1024, 3072)}


@dataclass
class GemvResult:
    rows: int
    cublas_us: float  # one replay: every layer's projections
    kernel_us: float


def replay_us(fn: Callable[[], None], reps: int = 50) -> float:
    """Microseconds per replay of `fn` captured in a CUDA graph (launch costs excluded)."""
    replay = as_graph(fn)
    replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps * 1e3


def run(rows: Sequence[int], layers: int = 28, shapes: Dict[str, Tuple[int, int]] = QWEN3_0_6B,
        dtype: torch.dtype = torch.bfloat16, reps: int = 50) -> List[GemvResult]:
    dev = torch.device("cuda")
    weights = {name: [torch.randn(n, k, device=dev, dtype=dtype) / k**0.5 for _ in range(layers)] for name,
               (n, k) in shapes.items()}
    results = []
    for m in rows:
        x = {name: torch.randn(m, k, device=dev, dtype=dtype) for name, (n, k) in shapes.items()}

        def cublas() -> None:
            for i in range(layers):
                for name in shapes:
                    y = F.linear(x[name], weights[name][i])
                    if name == "gate_up_proj":
                        silu_and_mul(y)

        def kernel() -> None:
            for i in range(layers):
                for name in shapes:
                    gemv(x[name], weights[name][i], silu_mul=name == "gate_up_proj")

        results.append(GemvResult(m, replay_us(cublas, reps), replay_us(kernel, reps)))
    return results


def main(argv: Optional[Sequence[str]] = None) -> List[GemvResult]:
    ap = argparse.ArgumentParser(prog="python -m minisgl.benchmark.gemv", description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,2,3,4", help="comma-separated row counts (requests in a decode step)")
    ap.add_argument("--layers", type=int, default=28, help="layers, each with its own weights")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("this benchmark times CUDA kernels: run it on a machine with a GPU")
    results = run([int(r) for r in args.rows.split(",")], args.layers)
    name = torch.cuda.get_device_name()
    print(f"{name}: the projections of {args.layers} layers (Qwen3-0.6B shapes, bfloat16, weights not in L2), one "
          "CUDA graph replay")
    print(f"{'rows':>4} {'cuBLAS + silu_and_mul':>22} {'gemv kernel':>12} {'ratio':>6}")
    for r in results:
        print(f"{r.rows:4d} {r.cublas_us:19.0f} us {r.kernel_us:9.0f} us {r.cublas_us / r.kernel_us:5.2f}x")
    return results


if __name__ == "__main__":
    main()
