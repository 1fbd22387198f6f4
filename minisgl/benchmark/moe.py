"""One mixture-of-experts layer: the fused Triton kernel against the PyTorch path.

The default shape is one layer of Qwen3-30B-A3B (hidden 2048, expert width 768, 128 experts, 8 of
them per token), random weights and router logits. For each token count, every backend's output
is first checked against the float32 PyTorch result, then timed (median of several rounds).
Timed eagerly, a small call mostly measures Python launching kernels; the Triton path is also
timed as a replayed CUDA graph, which is how decode runs it inside the engine. The bandwidth
column divides the expert weights the call has to read (each distinct expert the tokens picked,
once) by the best time: decode-sized calls are bound by it.

    python -m minisgl.benchmark.moe            # on a GPU: torch and triton, bfloat16
    python -m minisgl.benchmark.moe --quick    # small shapes, the torch path (runs on the CPU)
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence

import torch

from minisgl.moe import moe_forward_torch, select_experts


@dataclass
class MoEResult:
    backend: str
    tokens: int
    seconds: float  # one eager call, median
    graph_seconds: Optional[float]  # one replay of the call captured as a CUDA graph (GPU, Triton)
    weight_bytes: int  # distinct experts' weights the call reads
    rel_error: float  # max |out - float32 reference| / max |reference|

    @property
    def gb_per_s(self) -> float:
        return self.weight_bytes / min(self.seconds, self.graph_seconds or self.seconds) / 1e9


def _time(fn: Callable[[], torch.Tensor], device: torch.device, rounds: int, calls: int) -> float:
    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    fn()  # compiles kernels, warms caches
    sync()
    samples = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        samples.append((time.perf_counter() - t) / calls)
    return statistics.median(samples)


def as_graph(fn: Callable[[], torch.Tensor]) -> Callable[[], None]:
    """Capture `fn` (its inputs are fixed tensors) once; the returned function replays it."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream, as capture requires
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def run(
    token_counts: Sequence[int], hidden: int, inter: int, experts: int, top_k: int, backends: Sequence[str],
    dtype: torch.dtype, device: torch.device, rounds: int = 5, calls: int = 10, seed: int = 0,
) -> List[MoEResult]:  # fmt: skip
    gen = torch.Generator(device=device).manual_seed(seed)
    w13 = (torch.randn(experts, 2 * inter, hidden, device=device, generator=gen) / hidden**0.5).to(dtype)
    w2 = (torch.randn(experts, hidden, inter, device=device, generator=gen) / inter**0.5).to(dtype)
    per_expert = (w13[0].numel() + w2[0].numel()) * w13.element_size()
    impls = {"torch": moe_forward_torch}
    if "triton" in backends:
        from minisgl.moe.triton_moe import fused_moe  # needs Triton, which CUDA builds ship

        impls["triton"] = fused_moe
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    results = []
    for n in token_counts:
        x = torch.randn(n, hidden, device=device, generator=gen).to(dtype)
        weights, ids = select_experts(torch.randn(n, experts, device=device, generator=gen), top_k, True)
        weights = weights.to(dtype)
        want = moe_forward_torch(x.float(), w13.float(), w2.float(), weights.float(), ids)
        scale = want.abs().max().item()
        read = len(torch.unique(ids)) * per_expert
        for name in backends:
            fn = impls[name]
            err = (fn(x, w13, w2, weights, ids).float() - want).abs().max().item() / scale
            if err > tol:
                raise AssertionError(f"{name} at {n} tokens is off the float32 reference by {err:.2e} (tolerance "
                                     f"{tol})")
            call = lambda: fn(x, w13, w2, weights, ids)  # noqa: E731
            secs = _time(call, device, rounds, calls)
            graph_secs = _time(as_graph(call), device, rounds, calls) if name == "triton" else None  # torch syncs
            results.append(MoEResult(name, n, secs, graph_secs, read, err))
        line = "  ".join(
            f"{r.backend} {r.seconds * 1e6:8.1f} "
            "us" + (f" (graph {r.graph_seconds * 1e6:6.1f} us)" if r.graph_seconds else "") + f" {r.gb_per_s:7.1f} GB/s"
            for r in results[-len(backends) :]
        )  # fmt: skip
        speedup = ""
        if len(backends) > 1:
            speedup = f"  triton eager {results[-2].seconds / results[-1].seconds:5.1f}x torch"
        print(f"tokens {n:5d}  {line}{speedup}", flush=True)
    return results


def main(argv: Optional[Sequence[str]] = None) -> List[MoEResult]:
    ap = argparse.ArgumentParser(description="One MoE layer: fused Triton kernel vs the PyTorch path.")
    ap.add_argument("--tokens", default="1,16,64,256,1024,4096", help="comma-separated token counts")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--inter", type=int, default=768, help="one expert's intermediate width")
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--dtype", default="bfloat16", help="bfloat16 | float32")
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda")
    ap.add_argument("--quick", action="store_true", help="small shapes, a few rounds (runs on the CPU)")
    args = ap.parse_args(argv)
    auto = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(auto if args.device == "auto" else args.device)
    backends = ["torch", "triton"] if device.type == "cuda" else ["torch"]
    dtype = getattr(torch, args.dtype)
    if args.quick:
        tokens, hidden, inter, experts, top_k, rounds, calls = [1, 16], 64, 32, 8, 2, 2, 2
    else:
        tokens, rounds, calls = [int(t) for t in args.tokens.split(",")], 5, 10
        hidden, inter, experts, top_k = args.hidden, args.inter, args.experts, args.top_k
    if device.type == "cpu":
        dtype = torch.float32  # the CPU path is the reference: no reduced precision there
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"device: {name}; {dtype}; hidden {hidden}, expert width {inter}, {experts} experts, top {top_k}")
    return run(tokens, hidden, inter, experts, top_k, backends, dtype, device, rounds, calls)


if __name__ == "__main__":
    main()
