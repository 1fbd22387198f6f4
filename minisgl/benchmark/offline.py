"""Offline throughput: the nano-vllm workload, run through the engine's `LLM` front end.

256 requests; `random.seed(0)`; each prompt is `randint(100, 1024)` random token ids in
[0, 10000], each `max_tokens` is `randint(100, 1024)`, end-of-sequence is ignored; one warm-up;
throughput = requested output tokens / wall time. The full workload asks for 133,966 output
tokens from 142,827 prompt tokens.

    python -m minisgl.benchmark.offline                   # Qwen3-0.6B shape, random weights
    python -m minisgl.benchmark.offline --hf-baseline 32  # plus Hugging Face generate
    python -m minisgl.benchmark.offline --hf-cb 32        # plus transformers' continuous batching
    python -m minisgl.benchmark.offline --quick           # tiny model, seconds, CPU is fine
"""

from __future__ import annotations

import argparse
import gc
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Sequence

import numpy as np
import torch

from minisgl.core import SamplingParams
from minisgl.env import REPO_ROOT
from minisgl.llm import LLM
from minisgl.scheduler import SchedulerConfig
from minisgl.utils.misc import add_config_flags, config_options

from .build import build_llm, has_weights, release, sync

FULL_OUTPUT_TOKENS = 133_966
FULL_INPUT_TOKENS = 142_827


@dataclass(frozen=True)
class Workload:
    prompts: List[List[int]]
    max_tokens: List[int]

    @property
    def input_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)

    @property
    def output_tokens(self) -> int:
        return sum(self.max_tokens)

    def head(self, n: int) -> "Workload":
        return Workload(self.prompts[:n], self.max_tokens[:n])


def make_workload(num_seqs: int = 256, min_input: int = 100, max_input: int = 1024, min_output: int = 100,
                  max_output: int = 1024, seed: int = 0) -> Workload:
    """Prompts first, then output lengths, in the order nano-vllm draws them."""
    rng = random.Random(seed)  # the same stream as `random.seed(seed)`
    prompts = [[rng.randint(0, 10000) for _ in range(rng.randint(min_input, max_input))] for _ in range(num_seqs)]
    max_tokens = [rng.randint(min_output, max_output) for _ in range(num_seqs)]
    return Workload(prompts, max_tokens)


# ---- the memory-bandwidth floor -------------------------------------------------------------------
def decode_bytes(workload: Workload, weight_bytes: int, kv_bytes_per_token: int) -> int:
    """Bytes a decode phase must read at the least: all weights once per step, and every live
    request's KV once per step (request i's step s reads prompt_i + s tokens, s < max_tokens_i)."""
    p = np.array([len(x) for x in workload.prompts], dtype=np.int64)
    m = np.array(workload.max_tokens, dtype=np.int64)
    kv_tokens = int(((m - 1) * p + (m - 1) * m // 2).sum())
    steps = int(m.max()) - 1
    return steps * weight_bytes + kv_tokens * kv_bytes_per_token


def measure_copy_bandwidth(device: torch.device, nbytes: int = 4 << 30, repeats: int = 10) -> float:
    """Device-to-device copy rate in bytes/s, counting bytes read plus bytes written."""
    src = torch.randint(0, 255, (nbytes // 2,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    del src, dst
    torch.cuda.empty_cache()
    return nbytes / float(np.median(times))


@dataclass
class StepGroup:
    """Steps of one kind (prefill, or decode of a range of batch sizes) and their time."""

    label: str
    steps: int
    seconds: float  # sum of the intervals from each step's launch to the next one's
    floor_s: Optional[float]  # weights + live KV read once per step at the copy rate (decode only)


def time_by_batch_size(trace: Sequence, end: float, weight_bytes: int, kv_bytes_per_token: int, bandwidth: float,
                       width: int = 64) -> List[StepGroup]:
    """Where a run's wall time went: each step owns the interval from its launch to the next
    launch (the last one until `end`); decode steps are grouped by batch size in ranges of
    `width`, each group next to its floor. `trace`: the scheduler's `StepTrace`s of the run."""
    groups: dict = {}
    for t, nxt in zip(trace, [*(t.launched_at for t in trace[1:]), end]):
        if t.phase == "prefill":
            key, floor = (0, "prefill"), None
        else:
            top = -(-len(t.uids) // width) * width
            key, floor = (top, f"decode, {top - width + 1}-{top} "
                               "requests"), (weight_bytes + t.kv_tokens * kv_bytes_per_token) / bandwidth
        g = groups.setdefault(key, StepGroup(key[1], 0, 0.0, None if floor is None else 0.0))
        g.steps += 1
        g.seconds += nxt - t.launched_at
        if floor is not None:
            g.floor_s += floor
    return [groups[k] for k in sorted(groups)]


# ---- running ------------------------------------------------------------------------------------
@dataclass
class OfflineResult:
    seconds: float
    output_tokens: int
    input_tokens: int
    token_ids: List[List[int]]
    prefill_steps: int
    decode_steps: int
    trace: List = field(default_factory=list, repr=False)  # the run's StepTraces
    end: float = 0.0  # host clock when the last token was in

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds


def run_workload(llm: LLM, workload: Workload, temperature: float = 0.0) -> OfflineResult:
    params = [SamplingParams(max_tokens=m, ignore_eos=True, temperature=temperature) for m in workload.max_tokens]
    first_step = len(llm.trace)
    sync(llm)
    start = time.perf_counter()
    outs = llm.generate(workload.prompts, params)
    sync(llm)
    end = time.perf_counter()
    seconds = end - start
    token_ids = [o.token_ids for o in outs]
    for ids, m in zip(token_ids, workload.max_tokens):
        assert len(ids) == m, f"a request produced {len(ids)} tokens instead of {m}"
    trace = llm.trace[first_step:]
    phases = [t.phase for t in trace]
    return OfflineResult(seconds, sum(len(t) for t in token_ids), workload.input_tokens, token_ids,
                         phases.count("prefill"), phases.count("decode"), trace, end)


def warm_up(llm: LLM, seed: int = 1) -> None:
    """A short run through prefill and decode: compiles kernels before the clock starts."""
    rng = random.Random(seed)
    prompts = [[rng.randint(0, 10000) for _ in range(rng.randint(16, 300))] for _ in range(8)]
    llm.generate(prompts, SamplingParams(max_tokens=16, ignore_eos=True))


def _parse(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="Offline throughput on the nano-vllm workload.")
    ap.add_argument("--real-weights", action="store_true", help="load the checkpoint instead of random weights")
    ap.add_argument("--num-seqs", type=int, default=256, help="number of requests")
    ap.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0: greedy)")
    ap.add_argument("--hf-baseline", type=int, default=0, metavar="N",
                    help="also run Hugging Face generate on the first N requests")
    ap.add_argument("--hf-cb", type=int, default=0, metavar="N",
                    help="also run transformers' continuous batching on the first N requests")
    ap.add_argument("--quick", action="store_true", help="tiny model and workload (a smoke test that runs on the CPU)")
    # the engine's and the scheduler's own flags, as `python -m minisgl` takes them
    add_config_flags(ap, SchedulerConfig, helps={"model_path": "model directory (default: models/qwen3-0.6b-dummy; "
                                                               "with --quick models/tiny-qwen3)"})
    return ap.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> OfflineResult:
    args = _parse(argv)
    options = config_options(args, SchedulerConfig)
    model = options.pop("model_path", None)
    if args.quick:
        model = model or str(REPO_ROOT / "models" / "tiny-qwen3")
        workload = make_workload(min(args.num_seqs, 8), 8, 48, 4, 12)
    else:
        model = model or str(REPO_ROOT / "models" / "qwen3-0.6b-dummy")
        workload = make_workload(args.num_seqs)
        if args.num_seqs == 256:
            assert (workload.output_tokens, workload.input_tokens) == (FULL_OUTPUT_TOKENS, FULL_INPUT_TOKENS)
    dummy = options.pop("dummy_weights", not args.real_weights and not has_weights(model))  # config-only folders
    llm = build_llm(model, dummy_weights=dummy, **options)
    eng = llm.engine
    on_gpu = eng.device.type == "cuda"
    name = torch.cuda.get_device_name(eng.device) if on_gpu else "CPU"
    print(f"device: {name}; model {Path(model).name} ({'random' if dummy else 'real'} weights, {eng.dtype}); "
          f"attention {type(eng.attn_backend).__name__}; cuda graphs {'on' if eng.graph_runner else 'off'}")
    print(f"KV pool: {eng.num_pages} pages x {eng.page_size} tokens = {eng.num_pages * eng.page_size} tokens, "
          f"{eng.kv_pool_bytes / 1e9:.2f} GB")
    warm_up(llm)
    result = run_workload(llm, workload, args.temperature)
    print(
        f"workload: {len(workload.prompts)} requests, {result.input_tokens} prompt tokens, {result.output_tokens} "
        "output tokens "
        f"({result.prefill_steps} prefill + {result.decode_steps} decode steps)"
    )
    print(f"minisgl: {result.seconds:.2f} s, {result.tokens_per_s:,.0f} output tok/s")
    if on_gpu:
        _print_floor(llm, workload, result)
    if args.hf_baseline > 0 or args.hf_cb > 0:
        _compare_hf(llm, model, dummy, workload, args.hf_baseline, args.hf_cb, result, args.temperature)
    else:
        release(llm)
    return result


def _print_floor(llm: LLM, workload: Workload, result: OfflineResult) -> None:
    eng = llm.engine
    weight_bytes = sum(t.numel() * t.element_size() for t in eng.model.state_dict().values())
    kv_per_token = eng.kv_cache.bytes_per_page(eng.kv_cache.num_layers, 1, eng.kv_cache.num_kv_heads,
                                               eng.kv_cache.head_dim, eng.dtype)
    bw = measure_copy_bandwidth(eng.device)
    floor = decode_bytes(workload, weight_bytes, kv_per_token) / bw
    print(
        f"memory-bandwidth floor: weights {weight_bytes / 1e9:.2f} GB + live KV ({kv_per_token} B/token) read once "
        "per decode step "
        f"at {bw / 1e12:.2f} TB/s (measured copy) = {floor:.2f} s, i.e. at most {result.output_tokens / floor:,.0f} "
        "output tok/s; "
        f"measured time is {result.seconds / floor:.2f}x the floor"
    )
    print("where the time went (from each launch to the next; decode steps grouped by batch size, each group against "
          "its floor):")
    for g in time_by_batch_size(result.trace, result.end, weight_bytes, kv_per_token, bw):
        against = "" if g.floor_s is None else f"  floor {g.floor_s:5.2f} s ({g.seconds / g.floor_s:.2f}x)"
        print(f"  {g.label:<26} {g.steps:5d} steps {g.seconds:6.2f} s {g.seconds / g.steps * 1e3:7.2f} "
              f"ms/step{against}")


def _compare_hf(llm: LLM, model: str, dummy: bool, workload: Workload, n_generate: int, n_cb: int, full: OfflineResult,
                temperature: float) -> None:
    """Each baseline on the first N requests, the engine on the same N in the same process; then
    the baseline's rate scaled to the full workload (an upper bound on the ratio: a baseline's
    throughput grows with the number of requests it batches)."""
    from .hf_baseline import build_hf_model, hf_continuous_batching, hf_generate

    ours = {n: run_workload(llm, workload.head(n), temperature) for n in sorted({n_generate, n_cb} - {0})}
    device, dtype = llm.engine.device, llm.engine.dtype
    release(llm)
    hf = build_hf_model(model, dtype, device, dummy)
    runs = []
    if n_generate > 0:
        hf_generate(hf, workload.prompts[:2], [4, 4])  # warm-up
        runs.append((f"HF generate (sdpa, one left-padded batch of {n_generate}, greedy)", n_generate,
                     hf_generate(hf, workload.head(n_generate).prompts, workload.head(n_generate).max_tokens)))
    if n_cb > 0:
        hf_continuous_batching(hf, workload.prompts[:2], [4, 4])  # warm-up
        sub = workload.head(n_cb)
        runs.append((f"transformers continuous batching (init_continuous_batching, {n_cb} requests, greedy)", n_cb,
                     hf_continuous_batching(hf, sub.prompts, sub.max_tokens)))
    del hf
    gc.collect()
    for label, n, base in runs:
        mine = ours[n]
        same = sum(a == b for a, b in zip(base.token_ids, mine.token_ids))
        print(f"{label}: {base.seconds:.2f} s for {base.output_tokens} requested tokens = {base.tokens_per_s:,.0f} "
              "tok/s")
        print(f"minisgl on the same {n} requests: {mine.seconds:.2f} s = {mine.tokens_per_s:,.0f} tok/s "
              f"({mine.tokens_per_s / base.tokens_per_s:.1f}x on the same requests; {same}/{n} requests token-equal)")
        est = base.seconds * full.output_tokens / base.output_tokens
        print(
            f"  scaled: at {base.tokens_per_s:,.0f} tok/s the full workload's {full.output_tokens} tokens would take "
            f"~{est:.0f} s; "
            f"minisgl took {full.seconds:.2f} s: {full.tokens_per_s / base.tokens_per_s:.1f}x (an upper bound: the "
            "baseline's throughput grows with its batch)"
        )


if __name__ == "__main__":
    main()
