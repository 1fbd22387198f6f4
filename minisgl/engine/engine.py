"""`Engine`: one tensor-parallel rank's model, KV pool, page table, attention backend and sampler.

The engine knows nothing about requests arriving or finishing: it is given a prepared `Batch`,
runs the model, moves each request's ledger on (`complete_one`) and returns sampled tokens.

Weights are held once. Engines built in one process from the same checkpoint (same files, model
config, dtype, device and rank) share one set of weight tensors (`LOADED`), so a process that
builds several engines holds the model once; an edit to one engine's weights is seen by all of them.
Once loaded, the model goes through the package's kernel pass where the package has one (`KERNEL_PASS`).
"""

from __future__ import annotations

import importlib
import sys
import time
import weakref
from pathlib import Path
from typing import Dict

import torch

from minisgl.attention import create_attention_backend
from minisgl.core import Batch, Context, set_global_ctx
from minisgl.distributed.comm import min_over_ranks
from minisgl.distributed.info import TPInfo, set_tp_info
from minisgl.kvcache.mha_pool import MHAKVCache
from minisgl.layers.base import BaseOP
from minisgl.models import ModelConfig, create_model, load_checkpoint, load_dummy
from minisgl.utils import div_ceil, package_has
from minisgl.utils.logger import get_logger

from .config import EngineConfig
from .sample import Sampler, SamplerOutput, SamplingPlan
from .warmup import warm_up

logger = get_logger(__name__)


class LoadedWeights:
    """One checkpoint's weights as an engine's model holds them, by dotted name. Every engine that
    uses them keeps this object, so they live as long as one of those engines does."""

    def __init__(self, tensors: Dict[str, torch.Tensor]):
        self.tensors = tensors


# Weights engines hold, by checkpoint: an entry lives as long as one engine uses it.
LOADED: "weakref.WeakValueDictionary[tuple, LoadedWeights]" = weakref.WeakValueDictionary()


def _weights_key(config: EngineConfig, model_config: ModelConfig, dtype: torch.dtype, device: torch.device):
    files = sorted(Path(config.model_path).resolve().glob("*.safetensors"))
    stats = tuple((str(f), f.stat().st_mtime_ns, f.stat().st_size) for f in files)
    return stats, repr(model_config), str(dtype), str(device), config.tp_rank, config.tp_size


def _adopt(model: BaseOP, tensors: Dict[str, torch.Tensor]) -> None:
    for name, tensor in tensors.items():
        *path, leaf = name.split(".")
        owner = model
        for part in path:
            owner = owner[int(part)] if part.isdigit() else getattr(owner, part)
        assert getattr(owner, leaf).shape == tensor.shape, name
        setattr(owner, leaf, tensor)


KERNEL_PASS = "minisgl.kernel.swap"  # swaps kernels into the model's layers (a staged package may lack it)


def _swap_in_kernels(model: BaseOP) -> None:
    if package_has(KERNEL_PASS):
        importlib.import_module(KERNEL_PASS).swap_in_kernels(model)


class Engine:
    def __init__(self, config: EngineConfig):
        self.config = config
        self.device = config.torch_device
        self.dtype = config.torch_dtype
        set_tp_info(TPInfo(config.tp_rank, config.tp_size))
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        torch.manual_seed(config.seed)

        self.model_config = ModelConfig.from_dir(config.model_path)
        self.model = create_model(self.model_config, self.dtype, self.device)  # uninitialised: no memory yet
        self.weights = self._load_weights()

        self.max_seq_len = min(config.max_seq_len or self.model_config.max_position_embeddings,
                               self.model_config.max_position_embeddings)
        self.page_size = config.page_size
        qkv = self.model.model.layers[0].self_attn.qkv_proj
        # ranks may see different free memory; they must agree on one pool size
        num_pages = min_over_ranks(self._num_pages(qkv.num_kv_heads, qkv.head_dim), self.device)
        # one extra page at the end takes the KV writes of padding (dummy) requests
        self.kv_cache = MHAKVCache(self.model_config.num_layers, num_pages + 1, self.page_size, qkv.num_kv_heads,
                                   qkv.head_dim, self.dtype, self.device)
        self.num_pages = num_pages
        self.dummy_page = num_pages
        self.kv_cache.zero_page(self.dummy_page)
        # row `max_running_reqs` is the dummy row used to pad batches
        self.page_table = torch.zeros((config.max_running_reqs + 1, self.max_seq_len), dtype=torch.int32,
                                      device=self.device)
        self.page_table[config.max_running_reqs] = self.dummy_page * self.page_size
        self.attn_backend = create_attention_backend(
            config.attention_backend, self.kv_cache, self.page_table, pad_slot=self.dummy_page * self.page_size,
            num_qo_heads=qkv.num_q_heads
        )
        self.ctx = Context(page_size=self.page_size, kv_cache=self.kv_cache, attn_backend=self.attn_backend)
        set_global_ctx(self.ctx)
        self.sampler = Sampler(self.model_config.vocab_size)
        self.graph_runner = None
        if self.device.type == "cuda":  # compile and capture now, not on the first requests
            self._prepare_gpu()

    def _load_weights(self) -> LoadedWeights:
        """Fill the model: from weights another engine in this process already loaded from the same
        checkpoint, else from the checkpoint (random ones with `dummy_weights`, never shared)."""
        key = None if self.config.dummy_weights else _weights_key(self.config, self.model_config, self.dtype,
                                                                  self.device)
        loaded = LOADED.get(key) if key is not None else None
        if loaded is not None:
            _adopt(self.model, loaded.tensors)
            _swap_in_kernels(self.model)
            return loaded
        if key is None:
            load_dummy(self.model, self.config.seed)
        else:
            load_checkpoint(self.model, self.config.model_path)
        _swap_in_kernels(self.model)  # before the weights are shared, so others adopt the packed ones
        loaded = LoadedWeights(self.model.state_dict())
        if key is not None:
            LOADED[key] = loaded
        return loaded

    def _prepare_gpu(self) -> None:
        start = time.perf_counter()
        print("minisgl: compiling GPU kernels and capturing CUDA graphs (up to a minute or two on a fresh machine)",
              file=sys.stderr, flush=True)
        if self.wants_cuda_graph():
            from .graph import GraphRunner  # imported here: an optional module (wants_cuda_graph)

            self.graph_runner = GraphRunner(self, self.config.cuda_graph_max_bs)
        warm_up(self)
        print(f"minisgl: GPU ready in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)

    def _num_pages(self, kv_heads: int, head_dim: int) -> int:
        cfg = self.config
        per_page = MHAKVCache.bytes_per_page(self.model_config.num_layers, self.page_size, kv_heads, head_dim,
                                             self.dtype)
        useful = cfg.max_running_reqs * div_ceil(self.max_seq_len, self.page_size)
        if cfg.num_pages is not None:
            return cfg.num_pages
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            budget = int(free * cfg.memory_fraction) - (1 << 30)  # keep 1 GiB for activations and graphs
        else:
            budget = int(cfg.cpu_kv_budget_gb * (1 << 30))
        pages = min(budget // per_page, useful)
        if pages * self.page_size < self.max_seq_len:
            more = ("raise memory_fraction" if self.device.type == "cuda"
                    else "raise cpu_kv_budget_gb (--cpu-kv-budget-gb, or MINISGL_CPU_KV_BUDGET_GB)")
            raise MemoryError(
                f"the KV budget holds only {pages * self.page_size} tokens, less than one full context "
                f"({self.max_seq_len}); {more} or lower max_seq_len"
            )
        logger.info("KV pool: %d pages of %d tokens, %.2f GB", pages, self.page_size, pages * per_page / 2**30)
        return pages

    @property
    def kv_pool_bytes(self) -> int:
        return self.kv_cache.buffer.numel() * self.kv_cache.buffer.element_size()

    def forward_batch(self, batch: Batch, plan: SamplingPlan | None) -> SamplerOutput:
        """Run the model on a prepared batch; returns the next token of each request (`.tokens`,
        `[bs]` int32) and, where the plan asks, their log-probabilities."""
        # the layers read the KV pool and backend from the global context: make it this engine's,
        # so that several engines in one process (tests, notebooks) never use each other's pools
        set_global_ctx(self.ctx)
        if self.graph_runner is not None and self.graph_runner.can_run(batch):
            logits = self.graph_runner.run(batch)
        else:
            self.attn_backend.prepare_metadata(batch)
            with self.ctx.forward_batch(batch):
                logits = self.model.forward()
        for req in batch.reqs:
            req.complete_one()
        return self.sampler.run(logits[: batch.size], plan)

    def wants_cuda_graph(self) -> bool:
        """Capture decode steps as CUDA graphs: on CUDA, unless switched off, with a backend that
        supports capture, and only in a package that holds the graph runner (without it every step
        runs eagerly)."""
        return (
            self.device.type == "cuda"
            and self.config.use_cuda_graph  # off by default under MINISGL_DISABLE_CUDA_GRAPH=1
            and self.attn_backend.supports_cuda_graph()
            and package_has("minisgl.engine.graph")
        )
