"""Time per output token (TPOT) of decode at several batch sizes, with and without CUDA graphs.

For each batch size, `bs` fresh prompts each generate `1 + steps` tokens. The first token of
every request comes from prefill; the time from the moment the last request got its first
token to the moment the last token arrived, over `steps`, is the time of one decode step,
which is every request's time per output token.

On a GPU it then profiles a few decode steps and prints what one step runs: the kernel count,
the kernels grouped by name (launches and GPU time per step, heaviest first), and how much of
the step's span the GPU was busy (the rest is the GPU waiting for the host).

    python -m minisgl.benchmark.decode                 # Qwen3-0.6B shape, batch 1, 16, 64, 256
    python -m minisgl.benchmark.decode --quick         # tiny model, runs on the CPU
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from minisgl.core import SamplingParams
from minisgl.engine import EngineConfig
from minisgl.env import REPO_ROOT
from minisgl.llm import LLM
from minisgl.scheduler import SchedulerConfig
from minisgl.utils.misc import add_config_flags, config_options

from .build import build_llm, has_weights, release


@dataclass
class DecodeResult:
    batch_size: int
    cuda_graph: bool
    tpot_s: float
    kernels: Optional[float] = None  # GPU kernels one decode step launches (None on the CPU)
    profile: Optional[StepProfile] = None  # what those kernels are (None on the CPU)

    @property
    def tokens_per_s(self) -> float:
        return self.batch_size / self.tpot_s


def measure_tpot(llm: LLM, bs: int, input_len: int, steps: int, seed: int = 0) -> float:
    rng = random.Random(seed)
    # fresh prompts each time, so the prefix cache never shortens the prefill
    prompts = [[rng.randint(0, 10000) for _ in range(input_len)] for _ in range(bs)]
    first: dict = {}
    last = [0.0]
    inner = llm.on_token

    def on_token(req, token, finish_reason):  # token arrival times, on top of the usual bookkeeping
        now = time.perf_counter()
        first.setdefault(req.uid, now)
        last[0] = now
        inner(req, token, finish_reason)

    llm.on_token = on_token
    try:
        llm.generate(prompts, SamplingParams(max_tokens=1 + steps, ignore_eos=True))
    finally:
        del llm.on_token  # back to the class's method
    return (last[0] - max(first.values())) / steps


@dataclass
class KernelGroup:
    """Kernels of one name (template arguments dropped) within one decode step."""

    name: str
    count: float  # launches per step
    us: float  # GPU time per step, microseconds


@dataclass
class StepProfile:
    """What one decode step runs on the GPU, averaged over a few consecutive steps."""

    kernels: float  # kernels per step (copies and memsets are not kernels)
    busy_us: float  # sum of kernel and copy durations per step
    span_us: float  # first start to last end, divided by the steps: busy + idle gaps
    groups: List[KernelGroup]


def kernel_name(raw: str) -> str:
    """`void flashinfer::Foo<128u, ...>(Params)` -> `flashinfer::Foo`: one name per kernel family."""
    name = raw[5:] if raw.startswith("void ") else raw
    cut = [i for i in (name.find("<"), name.find("(")) if i > 0]
    return (name[: min(cut)] if cut else name).strip()


def group_kernels(events: Sequence[Tuple[str, float, float]], steps: int) -> StepProfile:
    """events: (name, start_us, end_us) of every GPU activity in `steps` consecutive steps."""
    by_name: Dict[str, List[float]] = {}
    for name, start, end in events:
        by_name.setdefault(kernel_name(name), []).append(end - start)
    groups = sorted((KernelGroup(n, len(d) / steps, sum(d) / steps) for n, d in by_name.items()), key=lambda g: -g.us)
    kernels = sum(1 for name, _, _ in events if not name.startswith(("Memcpy", "Memset"))) / steps
    busy = sum(end - start for _, start, end in events) / steps
    span = (max(e for _, _, e in events) - min(s for _, s, _ in events)) / steps if events else 0.0
    return StepProfile(kernels, busy, span, groups)


def profile_decode_steps(llm: LLM, bs: int, input_len: int, steps: int = 4, seed: int = 1) -> Optional[StepProfile]:
    """Profile `steps` consecutive decode steps of `bs` requests in their steady state (kernels
    inside a replayed CUDA graph are seen one by one). None on the CPU."""
    if llm.device.type != "cuda":
        return None
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    rng = random.Random(seed)
    uids = [llm.add_request([rng.randint(0, 10000) for _ in range(input_len)],
                            SamplingParams(max_tokens=steps + 8, ignore_eos=True)) for _ in range(bs)]
    while llm.prefill.pending or llm.prefill.chunked is not None:  # every prompt prefilled:
        llm.step()  # the profiled steps are decode steps only
    llm.step()
    llm.step()  # two decode steps: the overlap loop is now in its steady state
    torch.cuda.synchronize(llm.device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            llm.step()
        torch.cuda.synchronize(llm.device)
    while not llm.is_idle:
        llm.step()
    for uid in uids:
        llm.take_output(uid)
    events = [(e.name, e.time_range.start, e.time_range.end) for e in prof.events() if e.device_type == DeviceType.CUDA]
    return group_kernels(events, steps)


def kernel_table(p: StepProfile, top: int = 16) -> str:
    """The heaviest kernel families of a step, then the rest folded into one line."""
    lines = [f"    {'kernel':<60} {'per step':>9} {'us/step':>9}"]
    for g in p.groups[:top]:
        lines.append(f"    {g.name[:60]:<60} {g.count:9.1f} {g.us:9.1f}")
    rest = p.groups[top:]
    if rest:
        lines.append(f"    {f'({len(rest)} more names)':<60} {sum(g.count for g in rest):9.1f} "
                     f"{sum(g.us for g in rest):9.1f}")
    lines.append(f"    GPU busy {p.busy_us:.0f} us of a {p.span_us:.0f} us step span "
                 f"({100 * p.busy_us / max(p.span_us, 1e-9):.0f}%)")
    return "\n".join(lines)


# what this benchmark decides itself: graphs on and off are swept (--graphs), and the batch
# sizes fix the largest batch, the graphs captured, the context length and the KV pool's size
SET_BY_RUN = ("use_cuda_graph", "max_running_reqs", "cuda_graph_max_bs", "max_seq_len", "num_pages")


def run(model: str, dummy: bool, batch_sizes: Sequence[int], input_len: int, steps: int, graphs: Sequence[bool],
        **options) -> List[DecodeResult]:
    """`options`: any other engine or scheduler setting by name (not those in SET_BY_RUN)."""
    results = []
    max_bs = max(batch_sizes)
    page_size = options.get("page_size", EngineConfig.page_size)
    for use_graph in graphs:
        llm = build_llm(
            model,
            dummy_weights=dummy,
            max_running_reqs=max_bs,
            use_cuda_graph=use_graph,
            max_seq_len=input_len + steps + 8,
            num_pages=max_bs * (input_len + steps + 8 + page_size) // page_size + 16,
            **options,
        )
        measure_tpot(llm, min(max_bs, 4), input_len, 4)  # warm-up: compiles kernels
        for bs in batch_sizes:
            tpot = measure_tpot(llm, bs, input_len, steps)
            prof = profile_decode_steps(llm, bs, input_len)
            r = DecodeResult(bs, llm.engine.graph_runner is not None, tpot, None if prof is None else prof.kernels,
                             prof)
            results.append(r)
            kernels = "" if prof is None else f"  {prof.kernels:.0f} kernels/step"
            print(f"batch {bs:4d}  cuda graph {'on ' if r.cuda_graph else 'off'}  TPOT {r.tpot_s * 1e3:7.3f} ms  "
                  f"({r.tokens_per_s:,.0f} tok/s){kernels}", flush=True)
            if prof is not None:
                print(kernel_table(prof), flush=True)
        release(llm)
    return results


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m minisgl.benchmark.decode",
                                 description="Decode time per output token at several batch sizes.")
    ap.add_argument("--batch-sizes", default="1,16,64,256", help="comma-separated batch sizes")
    ap.add_argument("--input-len", type=int, default=512, help="prompt tokens per request")
    ap.add_argument("--steps", type=int, default=128, help="decode steps timed per batch size")
    ap.add_argument("--graphs", default="on,off", help="which settings to run: on, off or on,off")
    ap.add_argument("--quick", action="store_true", help="tiny model, batch 1 and 4, a few steps (runs on the CPU)")
    # the engine's and the scheduler's own flags, as `python -m minisgl` takes them
    add_config_flags(ap, SchedulerConfig, helps={"model_path": "model directory (default: models/qwen3-0.6b-dummy; "
                                                               "with --quick models/tiny-qwen3)"}, exclude=SET_BY_RUN)
    return ap


def main(argv: Optional[Sequence[str]] = None) -> List[DecodeResult]:
    args = build_parser().parse_args(argv)
    options = config_options(args, SchedulerConfig)
    model = options.pop("model_path", None)
    if args.quick:
        model = model or str(REPO_ROOT / "models" / "tiny-qwen3")
        sizes, input_len, steps = [1, 4], 16, 4
    else:
        model = model or str(REPO_ROOT / "models" / "qwen3-0.6b-dummy")
        sizes, input_len, steps = [int(s) for s in args.batch_sizes.split(",")], args.input_len, args.steps
    dummy = options.pop("dummy_weights", not has_weights(model))  # config-only folders
    graphs = [g.strip() == "on" for g in args.graphs.split(",")]
    if not torch.cuda.is_available() or options.get("device", EngineConfig.device).startswith("cpu"):
        graphs = [False]  # CUDA graphs need a GPU
    return run(model, dummy, sizes, input_len, steps, graphs, **options)


if __name__ == "__main__":
    main()
