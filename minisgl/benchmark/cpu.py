"""The engine against transformers on the CPU, in one run: a long prefill and a small chat batch.

    python -m minisgl.benchmark.cpu                  # bundled SmolLM2, float32
    python -m minisgl.benchmark.cpu --prefill-len 1000 --chat-prompts 8   # a quicker look

1. Prefill: one prompt of `--prefill-len` token ids through the engine (`max_tokens=1`: the
   prefill and one sampled token) against one transformers forward pass over the same ids.
2. Chat: `--chat-prompts` chat prompts, `--chat-tokens` tokens each, greedy, through
   `LLM.generate` against one left-padded batched `generate` (both stop at the same length).

Both sides use the same threads (`--threads`) and the same weights, and the greedy tokens are
compared, so a ratio is never bought with a different answer. Ratios above 1 mean the engine is
faster.
"""

from __future__ import annotations

import argparse
import functools
import random
import time
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence

import torch

from minisgl.core import SamplingParams
from minisgl.env import default_model_path
from minisgl.llm import LLM

from .hf_baseline import hf_generate

CHAT_TOPICS = ["the sea", "a train", "bread", "winter", "a lighthouse", "chess", "rain", "a library"]


@dataclass
class Ratio:
    name: str
    engine_s: float
    hf_s: float
    same: str  # how far the greedy tokens agree with transformers'

    @property
    def speedup(self) -> float:
        return self.hf_s / self.engine_s

    def line(self) -> str:
        times = f"engine {self.engine_s:7.2f} s   transformers {self.hf_s:7.2f} s"
        return f"{self.name:<32} {times}   {self.speedup:5.2f}x   ({self.same})"


def _lookalikes(prompts: List[List[int]], seed: int = 1) -> List[List[int]]:
    """Prompts of the same lengths with other (random) ids: a warm-up of the same shapes that
    leaves nothing in the prefix cache for the timed prompts to reuse."""
    rng = random.Random(seed)
    return [[rng.randint(100, 10000) for _ in p] for p in prompts]


def _warmed(llm: LLM, warm: List[List[int]]) -> LLM:
    """`llm` (a new engine) with its first-call costs (allocations for these shapes, kernel
    choices) paid outside the clock; its prefix cache holds nothing a timed prompt could reuse."""
    llm.generate(warm, SamplingParams(max_tokens=2, ignore_eos=True))
    return llm


@torch.inference_mode()
def prefill_ratio(make_llm: Callable[[], LLM], hf, length: int, repeats: int, seed: int = 0) -> Ratio:
    """The best of `repeats` runs of each side; every run of the engine is a fresh engine, so its
    prefix cache never serves the prompt of an earlier run (a cache hit is not a prefill)."""
    rng = random.Random(seed)
    ids = [rng.randint(0, 10000) for _ in range(length)]
    warm = _lookalikes([ids[:512]])
    hf(torch.tensor(warm))  # transformers' first call, likewise untimed
    engine_s, hf_s, same = float("inf"), float("inf"), True
    for _ in range(repeats):
        llm = _warmed(make_llm(), warm)
        start = time.perf_counter()
        out = llm.generate([ids], SamplingParams(max_tokens=1))[0]
        engine_s = min(engine_s, time.perf_counter() - start)
        llm.shutdown()
        start = time.perf_counter()
        logits = hf(torch.tensor([ids])).logits[0, -1]
        hf_s = min(hf_s, time.perf_counter() - start)
        same = same and out.token_ids == [int(logits.argmax())]
    return Ratio(f"prefill of {length} tokens", engine_s, hf_s, "same next token" if same else "NEXT TOKEN DIFFERS")


def chat_ratio(make_llm: Callable[[], LLM], hf, prompts: int, tokens: int, repeats: int) -> Ratio:
    """Within one run the engine may reuse the prompts' shared prefix (that is its prefix cache at
    work); across runs it may not: each run is a fresh engine."""
    texts = [f"Write two sentences about {CHAT_TOPICS[i % len(CHAT_TOPICS)]} (#{i})." for i in range(prompts)]
    llm = make_llm()  # the first run's engine, which also tokenizes
    ids = [llm.encode(t, chat=True) for t in texts]
    warm = _lookalikes(ids)
    pad = llm.tokenizer.pad_token_id if llm.tokenizer.pad_token_id is not None else 0
    params = SamplingParams(max_tokens=tokens, ignore_eos=True)
    hf_generate(hf, warm, [2] * prompts, pad_id=pad)  # untimed first call, the same shapes
    engine_s, hf_s = float("inf"), float("inf")
    for r in range(repeats):
        llm = _warmed(llm if r == 0 else make_llm(), warm)
        start = time.perf_counter()
        outs = llm.generate(ids, params)
        engine_s = min(engine_s, time.perf_counter() - start)
        llm.shutdown()
        start = time.perf_counter()
        ref = hf_generate(hf, ids, [tokens] * prompts, pad_id=pad)
        hf_s = min(hf_s, time.perf_counter() - start)
    # the batch is left-padded, which changes transformers' float32 rounding a little, so a
    # late token can flip between near-equal candidates: count whole agreeing requests
    agree = sum(o.token_ids == r for o, r in zip(outs, ref.token_ids))
    return Ratio(f"{prompts} chat prompts x {tokens} tokens", engine_s, hf_s, f"{agree}/{prompts} requests token-equal")


def _parse(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="The engine against transformers on the CPU.")
    ap.add_argument("--model", default=None, help="model directory (default: the bundled SmolLM2)")
    ap.add_argument("--prefill-len", type=int, default=4000, help="prompt tokens of the prefill test")
    ap.add_argument("--chat-prompts", type=int, default=32, help="prompts in the chat test")
    ap.add_argument("--chat-tokens", type=int, default=32, help="tokens generated per chat prompt")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads(), help="CPU threads for both sides")
    ap.add_argument("--repeats", type=int, default=2, help="runs per measurement (the best is kept)")
    return ap.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> List[Ratio]:
    args = _parse(argv)
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    model = args.model or str(default_model_path())
    make_llm = functools.partial(LLM, model, device="cpu", dtype="float32", max_seq_len=max(args.prefill_len + 8, 2048))
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32, attn_implementation="sdpa").eval()
    print(f"model {model}, float32, {args.threads} threads; best of {args.repeats} runs each, first calls untimed, a "
          "fresh engine per run")
    results = [
        prefill_ratio(make_llm, hf, args.prefill_len, args.repeats),
        chat_ratio(make_llm, hf, args.chat_prompts, args.chat_tokens, args.repeats),
    ]
    for r in results:
        print(r.line())
    return results


if __name__ == "__main__":
    main()
