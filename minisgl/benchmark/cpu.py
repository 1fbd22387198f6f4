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
import random
import time
from dataclasses import dataclass
from typing import List, Optional, Sequence

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
        return f"{self.name:<32} engine {self.engine_s:7.2f} s   transformers {self.hf_s:7.2f} s   {self.speedup:5.2f}x   ({self.same})"


def _best(fn, repeats: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


@torch.inference_mode()
def prefill_ratio(llm: LLM, hf, length: int, repeats: int, seed: int = 0) -> Ratio:
    rng = random.Random(seed)
    ids = [rng.randint(0, 10000) for _ in range(length)]
    one = SamplingParams(max_tokens=1)
    engine_s, outs = _best(lambda: llm.generate([ids], one), repeats)
    hf_s, logits = _best(lambda: hf(torch.tensor([ids])).logits[0, -1], repeats)
    same = "same next token" if outs[0].token_ids == [int(logits.argmax())] else "NEXT TOKEN DIFFERS"
    return Ratio(f"prefill of {length} tokens", engine_s, hf_s, same)


def chat_ratio(llm: LLM, hf, prompts: int, tokens: int, repeats: int) -> Ratio:
    texts = [f"Write two sentences about {CHAT_TOPICS[i % len(CHAT_TOPICS)]} (#{i})." for i in range(prompts)]
    ids = [llm.encode(t, chat=True) for t in texts]
    params = SamplingParams(max_tokens=tokens, ignore_eos=True)
    engine_s, outs = _best(lambda: llm.generate(ids, params), repeats)
    pad = llm.tokenizer.pad_token_id if llm.tokenizer.pad_token_id is not None else 0
    hf_s, ref = _best(lambda: hf_generate(hf, ids, [tokens] * prompts, pad_id=pad), repeats)
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
    llm = LLM(model, device="cpu", dtype="float32", max_seq_len=max(args.prefill_len + 8, 2048))
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32, attn_implementation="sdpa").eval()
    print(f"model {model}, float32, {args.threads} threads; best of {args.repeats} runs each")
    results = [
        prefill_ratio(llm, hf, args.prefill_len, args.repeats),
        chat_ratio(llm, hf, args.chat_prompts, args.chat_tokens, args.repeats),
    ]
    for r in results:
        print(r.line())
    llm.shutdown()
    return results


if __name__ == "__main__":
    main()
