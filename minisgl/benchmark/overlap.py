"""Overlap scheduling off and on: the host's share of a decode step, and what hiding it saves.

A decode step is host work (schedule the batch, prepare its tensors, launch the forward pass,
read the sampled tokens and finish requests) and device work. Without overlap they take turns;
with it, step N+1 is launched before step N's tokens are read, so the host's work of one step
runs while the device computes the next. For each batch size, `bs` requests decode `steps` tokens
on one engine, once with overlap off and once on. Every decode step is timed phase by phase on
the host: `schedule`, `prepare`, `launch` (the forward pass and the sampler; on a GPU this only
queues work, on the CPU it is the computation), `wait` (blocked until the device has the step's
tokens) and `read`. A step's time is the interval between the starts of consecutive decode steps;
every figure is a median over the steps of a run.

    python -m minisgl.benchmark.overlap                      # the bundled SmolLM2-135M, batch 1, 16, 64
    python -m minisgl.benchmark.overlap --device cpu --batch-sizes 1,4 --steps 8
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from minisgl.core import SamplingParams
from minisgl.env import default_model_path
from minisgl.llm import LLM
from minisgl.scheduler import SchedulerConfig
from minisgl.scheduler.prefill import SCHEDULE_POLICIES
from minisgl.utils.misc import add_config_flags, config_options

from .build import build_llm, has_weights

PHASES = ("schedule", "prepare", "launch", "wait", "read")
HOST_PHASES = ("schedule", "prepare", "launch", "read")  # the host is busy; `wait` it is not


@dataclass
class LoopTimes:
    """Mean milliseconds per decode step, for one batch size and one setting of overlap."""

    overlap: bool
    step_ms: float  # interval between the starts of consecutive decode steps
    phases_ms: Dict[str, float]  # median per decode step, keys PHASES

    @property
    def host_ms(self) -> float:
        return sum(self.phases_ms[p] for p in HOST_PHASES)

    @property
    def bookkeeping_ms(self) -> float:
        """Host work between two forward passes: everything but launching and waiting."""
        return sum(self.phases_ms[p] for p in ("schedule", "prepare", "read"))


@dataclass
class OverlapResult:
    batch_size: int
    device: str
    off: LoopTimes
    on: LoopTimes

    @property
    def host_share(self) -> float:
        """Fraction of a step, overlap off, in which the host is busy (the device waits for it
        unless the launch itself is still feeding the device)."""
        return self.off.host_ms / self.off.step_ms

    @property
    def bookkeeping_share(self) -> float:
        """Fraction of a step, overlap off, spent scheduling, preparing and reading."""
        return self.off.bookkeeping_ms / self.off.step_ms

    @property
    def saved(self) -> float:
        """Fraction of the step time that overlap removes."""
        return 1 - self.on.step_ms / self.off.step_ms


def instrument(llm: LLM) -> List[dict]:
    """Time each phase of every decode step of `llm` from now on; returns the growing list of
    steps ({"start": seconds, phase: seconds, ...}), in launch order."""
    steps: List[dict] = []
    by_batch: Dict[int, dict] = {}
    schedule, prepare, launch, process = llm.schedule_next_batch, llm.prepare, llm.launch, llm.process_results

    def schedule_():
        t0 = time.perf_counter()
        batch = schedule()
        if batch is not None and batch.is_decode:
            rec = {"start": t0, "schedule": time.perf_counter() - t0}
            by_batch[id(batch)] = rec
            steps.append(rec)
        return batch

    def prepare_(batch):
        t0 = time.perf_counter()
        prepare(batch)
        if id(batch) in by_batch:
            by_batch[id(batch)]["prepare"] = time.perf_counter() - t0

    def launch_(batch):
        t0 = time.perf_counter()
        result = launch(batch)
        rec = by_batch.get(id(batch))
        if rec is not None:
            rec["launch"] = time.perf_counter() - t0 - rec["prepare"]  # launch calls prepare
        return result

    def process_(result):
        rec = by_batch.pop(id(result.batch), None)
        t0 = time.perf_counter()
        if result.done is not None:
            result.done.synchronize()  # so the wait is not counted as reading
        t1 = time.perf_counter()
        process(result)
        if rec is not None:
            rec["wait"], rec["read"] = t1 - t0, time.perf_counter() - t1

    llm.schedule_next_batch, llm.prepare, llm.launch, llm.process_results = schedule_, prepare_, launch_, process_
    return steps


def loop_times(steps: List[dict], overlap: bool) -> LoopTimes:
    """Medians over the decode steps of one run (the first one, after prefill, is left out):
    on a shared machine a step that lost the CPU to another process does not move a median."""
    steps = steps[1:]
    if len(steps) < 3:
        raise ValueError("need at least four decode steps to time them: raise --steps")
    intervals = [b["start"] - a["start"] for a, b in zip(steps, steps[1:])]
    phases = {p: statistics.median(s.get(p, 0.0) for s in steps[:-1]) * 1e3 for p in PHASES}
    return LoopTimes(overlap, statistics.median(intervals) * 1e3, phases)


def measure(llm: LLM, bs: int, input_len: int, steps: int, overlap: bool, seed: int = 0) -> LoopTimes:
    rng = random.Random(seed)
    vocab = llm.engine.model_config.vocab_size
    # fresh prompts each time, so the prefix cache never shortens the prefill
    prompts = [[rng.randrange(vocab) for _ in range(input_len)] for _ in range(bs)]
    llm.config = dataclasses.replace(llm.config, overlap=overlap)  # read by every step
    timed = instrument(llm)
    try:
        llm.generate(prompts, SamplingParams(max_tokens=steps + 1, ignore_eos=True))
    finally:
        for name in ("schedule_next_batch", "prepare", "launch", "process_results"):
            delattr(llm, name)  # back to the class's methods
    return loop_times(timed, overlap)


# what this benchmark decides itself: overlap off and on is what it compares, the batch sizes
# fix the largest batch, the graphs captured and the context length, and every prompt is fresh,
# so the prefix cache has nothing to find (the naive one spends nothing looking; no cache, no
# longest-prefix-first order either, nor the settings a policy reads, such as a bound on its wait)
SET_BY_RUN = ("overlap", "max_running_reqs", "cuda_graph_max_bs", "max_seq_len", "prefix_cache", "schedule_policy",
              *dict.fromkeys(name for policy in SCHEDULE_POLICIES.values() for name in policy.settings))


def run(model: str, dummy: bool, batch_sizes: Sequence[int], input_len: int, steps: int,
        **options) -> List[OverlapResult]:
    """`options`: any other engine or scheduler setting by name (not those in SET_BY_RUN)."""
    max_bs = max(batch_sizes)
    llm = build_llm(model, dummy_weights=dummy, max_running_reqs=max_bs, max_seq_len=input_len + steps + 8,
                    prefix_cache="naive", **options)
    measure(llm, min(max_bs, 4), input_len, 4, overlap=False)  # warm-up: kernels, allocator
    results = []
    for bs in batch_sizes:
        off = measure(llm, bs, input_len, steps, overlap=False)
        on = measure(llm, bs, input_len, steps, overlap=True)
        r = OverlapResult(bs, f"{llm.device.type} ({llm.engine.attn_backend.__class__.__name__}, CUDA graphs "
                              f"{'on' if llm.engine.graph_runner else 'off'})", off, on)
        results.append(r)
        print(report(r), flush=True)
    llm.shutdown()
    return results


def report(r: OverlapResult) -> str:
    phases = ", ".join(f"{p} {r.off.phases_ms[p]:.2f}" for p in PHASES)
    return (
        f"{r.device} batch {r.batch_size:3d}: overlap off {r.off.step_ms:8.2f} ms/step ({phases} ms; "
        f"schedule+prepare+read {100 * r.bookkeeping_share:.0f}% of the step, host busy {100 * r.host_share:.0f}%) | "
        f"overlap on {r.on.step_ms:8.2f} ms/step (wait {r.on.phases_ms['wait']:.2f} ms) | saved {100 * r.saved:.0f}%"
    )


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m minisgl.benchmark.overlap",
                                 description="Decode step time with overlap scheduling off and on, phase by phase.")
    ap.add_argument("--batch-sizes", default="1,16,64", help="comma-separated batch sizes")
    ap.add_argument("--input-len", type=int, default=256, help="prompt tokens per request")
    ap.add_argument("--steps", type=int, default=64, help="decode steps per run")
    ap.add_argument("--json", type=Path, default=None, help="also write the results to this file")
    # the engine's and the scheduler's own flags, as `python -m minisgl` takes them
    add_config_flags(ap, SchedulerConfig, helps={"dummy_weights": "random weights from the model's config.json; "
                                                                  "implied when the folder has no "
                                                                  "*.safetensors"}, exclude=SET_BY_RUN)
    return ap


def main(argv: Optional[Sequence[str]] = None) -> List[OverlapResult]:
    args = build_parser().parse_args(argv)
    options = config_options(args, SchedulerConfig)
    model = options.pop("model_path", None) or str(default_model_path())
    dummy = options.pop("dummy_weights", not has_weights(model))  # config-only folders
    results = run(model, dummy, [int(s) for s in args.batch_sizes.split(",")], args.input_len, args.steps, **options)
    if args.json is not None:
        args.json.write_text(json.dumps([dataclasses.asdict(r) for r in results], indent=1) + "\n")
    return results


if __name__ == "__main__":
    main()
