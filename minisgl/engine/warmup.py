"""Compile before serving: a GPU engine's first forward passes compile kernels (FlashInfer's JIT,
Triton's), which would otherwise land on the first requests' time to first token. `warm_up` is one
of the steps chapter 6's engine runs on a GPU before it serves (`prepares_gpu`), after the graph
capture, which compiles the decode kernels."""

from __future__ import annotations

import time
from typing import Protocol, Sequence

import torch

from minisgl.attention.base import BaseAttnBackend
from minisgl.core import Batch, Context, Req, SamplingParams
from minisgl.engine.config import EngineConfig
from minisgl.engine.engine import prepares_gpu
from minisgl.kvcache.mha_pool import MHAKVCache
from minisgl.models.llama import CausalLM

# Triton specialises an integer argument on being 1 and on being a multiple of 16: one prompt of
# each kind of length compiles every variant a real one can need; and a batch as wide as a busy
# server's grows the memory allocator's pool now rather than under the first requests
WARMUP_PROMPT_LENS = (1, 16, 17) + (24,) * 61


class WarmupHost(Protocol):
    """What `warm_up` uses of the `Engine`."""

    config: EngineConfig
    device: torch.device
    page_size: int
    dummy_page: int
    page_table: torch.Tensor
    kv_cache: MHAKVCache
    attn_backend: BaseAttnBackend
    ctx: Context
    model: CausalLM


@prepares_gpu("compiling GPU kernels")
def warm_up(engine: WarmupHost, prompt_lens: Sequence[int] = WARMUP_PROMPT_LENS) -> float:
    """Run one eager prefill batch (one request per length in `prompt_lens`) on the page table's
    dummy row; its KV writes go to the dummy page, which is zeroed again afterwards. Decode kernels
    are compiled by CUDA-graph capture. Returns the seconds it took."""
    start = time.perf_counter()
    prompt_lens = prompt_lens[: max(3, engine.config.max_running_reqs)]  # no wider than a real batch
    dev, dummy_row = engine.device, engine.page_table.shape[0] - 1
    reqs = [Req(torch.zeros(n, dtype=torch.int32), dummy_row, 0, -1 - i, SamplingParams(max_tokens=1), None)
            for i, n in enumerate(prompt_lens)]
    total = sum(prompt_lens)
    ends = torch.tensor(prompt_lens).cumsum(0)
    batch = Batch(
        reqs=reqs,
        phase="prefill",
        input_ids=torch.zeros(total, dtype=torch.int32, device=dev),
        positions=torch.cat([torch.arange(n) for n in prompt_lens]).to(dev),
        out_loc=torch.full((total,), engine.dummy_page * engine.page_size, dtype=torch.int64, device=dev),
        last_indices=(ends - 1).to(dev),
    )
    engine.attn_backend.prepare_metadata(batch)
    with engine.ctx.forward_batch(batch):
        engine.model.forward()
    engine.kv_cache.zero_page(engine.dummy_page)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return time.perf_counter() - start
