"""Time to first token of the first requests an engine serves, against its steady state.

An engine that compiles kernels on first use (FlashInfer's JIT, Triton) makes its first requests
wait for the compiler. This builds an `LLM`, then sends the same kind of batch several times (64
short prompts of different lengths, one output token each, so the wall time of a batch is its time
to first token) and prints each batch's time and the first one's ratio to the median of the others.

    python -m minisgl.benchmark.first_request            # Qwen3-0.6B shape, random weights
    python -m minisgl.benchmark.first_request --quick    # tiny model (runs on the CPU)
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import List

from minisgl.core import SamplingParams
from minisgl.env import REPO_ROOT

from .build import build_llm, has_weights, release


def batch_times(llm, batches: int, bs: int, seed: int = 0) -> List[float]:
    """Seconds each of `batches` batches of `bs` fresh prompts took to their first (and only) token."""
    rng = random.Random(seed)
    params = SamplingParams(max_tokens=1, ignore_eos=True)
    times = []
    for _ in range(batches):
        prompts = [[rng.randint(0, 10000) for _ in range(rng.randint(8, 64))] for _ in range(bs)]
        start = time.perf_counter()
        llm.generate(prompts, params)
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(REPO_ROOT / "models" / "qwen3-0.6b-dummy"), help="model directory")
    ap.add_argument("--batches", type=int, default=5, help="batches sent one after another")
    ap.add_argument("--batch-size", type=int, default=64, help="prompts per batch")
    ap.add_argument("--quick", action="store_true", help="tiny model, small batches (runs on the CPU)")
    args = ap.parse_args()
    model = str(REPO_ROOT / "models" / "tiny-llama") if args.quick else args.model
    start = time.perf_counter()
    llm = build_llm(model, dummy_weights=not has_weights(model), max_running_reqs=args.batch_size)
    print(f"engine built (and warmed) in {time.perf_counter() - start:.1f} s", flush=True)
    times = batch_times(llm, args.batches, 4 if args.quick else args.batch_size)
    release(llm)
    steady = statistics.median(times[1:])
    for i, t in enumerate(times):
        print(f"batch {i}: {t * 1e3:8.1f} ms")
    print(f"first batch {times[0] * 1e3:.1f} ms, steady state (median of the rest) {steady * 1e3:.1f} ms: "
          f"{times[0] / steady:.2f}x")


if __name__ == "__main__":
    main()
