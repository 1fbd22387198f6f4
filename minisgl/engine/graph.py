"""`GraphRunner`: decode steps replayed from captured CUDA graphs.

A decode step launches hundreds of small kernels; at small batch sizes launching them costs
more than running them. A CUDA graph records the whole forward pass once per batch size and
replays it with one launch. Graphs have fixed shapes and fixed addresses, so:

- inputs (token ids, positions, KV slots) are copied into static buffers before each replay;
- a batch is padded up to the next captured size with dummy requests that use the page
  table's dummy row, so they read and write only the dummy page;
- the attention backend's metadata is planned into fixed buffers for that size, by the graph
  support registered for its class (`minisgl.attention.graph_support`); a backend without one is
  not captured.

The sampler runs after the replay, on the real rows of the logits.

The runner plugs into chapter 6's engine as a fast path (`Engine.fast_path_for` asks it first),
kept as `engine.graph_runner`; its settings (`use_cuda_graph`, `cuda_graph_max_bs`) join the
engine's config from here (`GraphConfig`).
"""

from __future__ import annotations

import bisect
import gc
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Protocol

import torch

from minisgl.attention.base import BaseAttnBackend
from minisgl.attention.graph_support import graph_support_for
from minisgl.core import Batch, Context
from minisgl.engine.config import EngineConfig
from minisgl.engine.engine import fast_path
from minisgl.env import declare_switches, switch
from minisgl.models.llama import CausalLM
from minisgl.utils.logger import get_logger
from minisgl.utils.settings import extends_config

logger = get_logger(__name__)


@dataclass(frozen=True)
class GraphSwitches:
    disable_cuda_graph: bool = field(default=False, metadata=switch(
        "decode steps run eagerly unless a front end asks for CUDA graphs"))


GRAPH_ENV = declare_switches(GraphSwitches)


@extends_config(EngineConfig)
@dataclass(frozen=True)
class GraphConfig:
    """the engine's settings for CUDA graphs"""

    use_cuda_graph: bool = field(default_factory=lambda: not GRAPH_ENV.disable_cuda_graph, metadata={
        "flag": "cuda_graph", "help": "replay decode steps as CUDA graphs; default: on, unless "
                                      "MINISGL_DISABLE_CUDA_GRAPH=1"})
    cuda_graph_max_bs: int = field(default=256, metadata={"help": "largest decode batch captured as a CUDA graph "
                                                                  "(larger ones run eagerly)"})


def graph_batch_sizes(max_bs: int) -> List[int]:
    """1, 2, 4, 8, then every multiple of 8 up to `max_bs` (and `max_bs` itself)."""
    sizes = [s for s in (1, 2, 4, 8) if s <= max_bs]
    sizes += list(range(16, max_bs + 1, 8))
    if max_bs not in sizes:
        sizes.append(max_bs)
    return sorted(set(sizes))


class GraphRunner:
    def __init__(self, engine: "GraphHost", max_bs: int):
        self.engine = engine
        self.max_bs = min(max_bs, engine.config.max_running_reqs)
        self.bs_list = graph_batch_sizes(self.max_bs)
        dev = engine.device
        self.dummy_slot = engine.dummy_page * engine.page_size
        # static inputs: every graph reads a prefix of these
        self.input_ids = torch.zeros(self.max_bs, dtype=torch.int32, device=dev)
        self.positions = torch.zeros(self.max_bs, dtype=torch.int64, device=dev)
        self.out_loc = torch.full((self.max_bs,), self.dummy_slot, dtype=torch.int64, device=dev)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: Dict[int, torch.Tensor] = {}
        start = time.perf_counter()
        make_support = graph_support_for(engine.attn_backend)
        if make_support is None:
            raise ValueError(f"the {type(engine.attn_backend).__name__} attention backend registers no CUDA-graph "
                             "support (minisgl.attention.graph_support): run it with use_cuda_graph=False")
        # the backend's fixed buffers for every captured size: what its captured kernels read
        self.attn_support = make_support(engine.attn_backend, self.max_bs, self.bs_list)
        self._capture_all()
        logger.info("captured %d decode graphs (batch sizes %s) in %.1f s", len(self.graphs), self.bs_list,
                    time.perf_counter() - start)

    def _static_batch(self, bs: int) -> Batch:
        return Batch(reqs=[], phase="decode", input_ids=self.input_ids[:bs], positions=self.positions[:bs],
                     out_loc=self.out_loc[:bs])

    def _capture_all(self) -> None:
        engine = self.engine
        ctx = engine.ctx
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(device=engine.device)
        # A garbage collection during a capture may free an old object that owns a CUDA event or
        # pinned memory; the driver call that frees it is illegal while capturing and voids the
        # graph. Collect first, then keep the collector off until every graph is captured.
        gc.collect()
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            # largest first: smaller graphs then fit in the memory the larger one left in the pool
            for bs in reversed(self.bs_list):
                batch = self._static_batch(bs)
                self.attn_support.prepare_for_capture(batch, bs)
                with ctx.forward_batch(batch):
                    engine.model.forward()  # warm-up: compiles kernels, allocates outside the graph
                torch.cuda.synchronize(engine.device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=stream):
                    with ctx.forward_batch(batch):
                        self.logits[bs] = engine.model.forward()
                self.graphs[bs] = graph
        finally:
            if gc_was_enabled:
                gc.enable()
        torch.cuda.synchronize(engine.device)

    def padded_size(self, bs: int) -> int:
        return self.bs_list[bisect.bisect_left(self.bs_list, bs)]

    def can_run(self, batch: Batch) -> bool:
        return batch.is_decode and 0 < batch.size <= self.max_bs

    def run(self, batch: Batch) -> torch.Tensor:
        """Replay the graph for `batch` (padded); returns logits `[batch.size, vocab]`."""
        bs = batch.size
        pad = self.padded_size(bs)
        self.input_ids[:bs].copy_(batch.input_ids)
        self.positions[:bs].copy_(batch.positions)
        self.out_loc[:bs].copy_(batch.out_loc)
        if pad > bs:
            # rows past the batch may hold an earlier batch's slots: point them at the dummy page
            self.out_loc[bs:pad].fill_(self.dummy_slot)
            self.positions[bs:pad].zero_()
        self.attn_support.prepare_for_replay(batch, pad)
        self.graphs[pad].replay()
        return self.logits[pad][:bs]


class GraphHost(Protocol):
    """What a `GraphRunner` uses of the `Engine` that builds it."""

    config: EngineConfig  # the complete one: it has GraphConfig's fields too
    device: torch.device
    page_size: int
    dummy_page: int  # the page table's dummy row points here: padding requests read and write it
    attn_backend: BaseAttnBackend
    ctx: Context
    model: CausalLM


def wants_cuda_graph(engine: GraphHost) -> bool:
    """Capture decode steps as CUDA graphs: on CUDA, unless switched off, with a backend that
    registers graph support (otherwise every step runs eagerly)."""
    return (
        engine.device.type == "cuda"
        and engine.config.use_cuda_graph  # off by default under MINISGL_DISABLE_CUDA_GRAPH=1
        and graph_support_for(engine.attn_backend) is not None
    )


@fast_path("graph_runner", doing="capturing CUDA graphs", wanted=lambda config: config.use_cuda_graph)
def capture_graphs(engine: GraphHost) -> Optional[GraphRunner]:
    """The engine's `graph_runner`: every decode size of the ladder captured, where graphs are wanted."""
    return GraphRunner(engine, engine.config.cuda_graph_max_bs) if wants_cuda_graph(engine) else None
