"""`Engine`: one tensor-parallel rank's model, KV pool, page table, attention backend and sampler.

The engine knows nothing about requests arriving or finishing: it is given a prepared `Batch`,
runs the model, moves each request's ledger on (`complete_one`) and returns sampled tokens.

Weights are held once. Engines built in one process from the same checkpoint (same files, model
config, dtype, device and rank) share one set of weight tensors (`LOADED`), so a process that
builds several engines holds the model once; an edit to one engine's weights is seen by all of them.

Later chapters make the engine faster without editing it, through three seams: a *pass after
loading* (`after_load`) changes the loaded model in place, on every device; a *fast path*
(`fast_path`) is another way to run a prepared batch, built once per engine on a GPU and asked
first whether it can run each batch (else the model runs eagerly); a *GPU preparation step*
(`prepares_gpu`) runs once on a GPU engine before it serves, after the fast paths are built.
A package whose modules register none runs the plain model eagerly.
"""

from __future__ import annotations

import sys
import time
import weakref
from pathlib import Path
from typing import Callable, Dict, Optional, Protocol, Tuple

import torch

from minisgl.attention import create_attention_backend
from minisgl.core import Batch, Context, set_global_ctx
from minisgl.distributed.comm import min_over_ranks
from minisgl.distributed.info import TPInfo, set_tp_info
from minisgl.kvcache.mha_pool import MHAKVCache
from minisgl.layers.base import BaseOP
from minisgl.models import ModelConfig, create_model, load_checkpoint, load_dummy
from minisgl.utils import div_ceil
from minisgl.utils.logger import get_logger

from .config import EngineConfig
from .sample import Sampler, SamplerOutput, SamplingPlan

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


class FastPath(Protocol):
    """A way to run some prepared batches faster than the eager forward pass."""

    def can_run(self, batch: Batch) -> bool: ...

    def run(self, batch: Batch) -> torch.Tensor:
        """Logits of `batch`, `[batch.size, vocab]`, as the eager forward pass gives them."""
        ...


FastPathBuilder = Callable[["Engine"], Optional[FastPath]]  # None: this engine runs without it
PrepareStep = Callable[["Engine"], object]
ConfigTest = Callable[[EngineConfig], bool]
# engine attribute -> (what building it does, as the start-up message says it; its builder; whether a config
# asks for it)
_FAST_PATHS: Dict[str, Tuple[str, FastPathBuilder, ConfigTest]] = {}
_GPU_STEPS: Dict[str, PrepareStep] = {}  # what the step does -> the step
ModelPass = Callable[[BaseOP], object]
_LOAD_PASSES: Dict[str, ModelPass] = {}  # what the pass does -> the pass


def _always(config: EngineConfig) -> bool:
    return True


def fast_path(attribute: str, doing: str,
              wanted: ConfigTest = _always) -> Callable[[FastPathBuilder], FastPathBuilder]:
    """Decorator: register a builder of a fast path. Every engine has `attribute` (None until built);
    a GPU engine sets it to what the builder returns, once, after loading. `wanted`: whether a config
    asks for this fast path, for messages said before an engine exists (the builder decides). Registering
    an attribute again (a module imported afresh) replaces its builder."""
    def register(build: FastPathBuilder) -> FastPathBuilder:
        _FAST_PATHS[attribute] = (doing, build, wanted)
        return build
    return register


def prepares_gpu(doing: str) -> Callable[[PrepareStep], PrepareStep]:
    """Decorator: register a step a GPU engine runs once before it serves, after building its fast
    paths, in registration order (its return value is ignored)."""
    def register(step: PrepareStep) -> PrepareStep:
        _GPU_STEPS[doing] = step
        return step
    return register


def after_load(doing: str) -> Callable[[ModelPass], ModelPass]:
    """Decorator: register a pass every engine runs over its model once the weights are in, on every device,
    in registration order (its return value is ignored). It runs before the weights are shared with other
    engines, and again over a model that adopts shared weights, so it must leave a model it already ran over
    as it is."""
    def register(run: ModelPass) -> ModelPass:
        _LOAD_PASSES[doing] = run
        return run
    return register


def _run_load_passes(model: BaseOP) -> None:
    for run in _LOAD_PASSES.values():
        run(model)


def fast_path_names() -> Tuple[str, ...]:
    """The engine attributes that hold the registered fast paths, in registration order."""
    return tuple(_FAST_PATHS)


def gpu_steps() -> Tuple[str, ...]:
    """What the registered GPU preparation steps do, in the order they run."""
    return tuple(_GPU_STEPS)


def load_passes() -> Tuple[str, ...]:
    """What the registered passes after loading do, in the order they run."""
    return tuple(_LOAD_PASSES)


def gpu_preparation(config: EngineConfig) -> Tuple[str, ...]:
    """What a GPU engine built from `config` does before it serves, as its start-up messages say it:
    the registered preparation steps and the fast paths `config` asks for."""
    return (*_GPU_STEPS, *(doing for doing, _, wanted in _FAST_PATHS.values() if wanted(config)))


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
        # one extra page at the end, the dummy page: zeroed, so a read through it finds no garbage
        self.kv_cache = MHAKVCache(self.model_config.num_layers, num_pages + 1, self.page_size, qkv.num_kv_heads,
                                   qkv.head_dim, self.dtype, self.device)
        self.num_pages = num_pages
        self.dummy_page = num_pages
        self.kv_cache.zero_page(self.dummy_page)
        # row `max_running_reqs` is the dummy row: every slot of it is on the dummy page
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
        for attribute in _FAST_PATHS:
            setattr(self, attribute, None)
        if self.device.type == "cuda":  # prepare now, not on the first requests
            self._prepare_gpu()

    def _load_weights(self) -> LoadedWeights:
        """Fill the model: from weights another engine in this process already loaded from the same
        checkpoint, else from the checkpoint (random ones with `dummy_weights`, never shared)."""
        key = None if self.config.dummy_weights else _weights_key(self.config, self.model_config, self.dtype,
                                                                  self.device)
        loaded = LOADED.get(key) if key is not None else None
        if loaded is not None:
            _adopt(self.model, loaded.tensors)
            _run_load_passes(self.model)
            return loaded
        if key is None:
            load_dummy(self.model, self.config.seed)
        else:
            load_checkpoint(self.model, self.config.model_path)
        _run_load_passes(self.model)  # before the weights are shared, so others adopt what the passes made
        loaded = LoadedWeights(self.model.state_dict())
        if key is not None:
            LOADED[key] = loaded
        return loaded

    def _prepare_gpu(self) -> None:
        """Build the registered fast paths, then run the registered preparation steps."""
        if not _GPU_STEPS and not _FAST_PATHS:
            return
        start = time.perf_counter()
        doing = gpu_preparation(self.config)
        if doing:
            print(f"minisgl: {' and '.join(doing)} (up to a minute or two on a fresh machine)", file=sys.stderr,
                  flush=True)
        for attribute, (_, build, _) in _FAST_PATHS.items():
            setattr(self, attribute, build(self))
        for step in _GPU_STEPS.values():
            step(self)
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
            budget = int(free * cfg.memory_fraction) - (1 << 30)  # keep 1 GiB for activations and workspaces
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
        `[bs]` int32) and the after-sampling reports the plan asks for (`.reports`)."""
        # the layers read the KV pool and backend from the global context: make it this engine's,
        # so that several engines in one process (tests, notebooks) never use each other's pools
        set_global_ctx(self.ctx)
        fast = self.fast_path_for(batch)
        if fast is not None:
            logits = fast.run(batch)
        else:
            self.attn_backend.prepare_metadata(batch)
            with self.ctx.forward_batch(batch):
                logits = self.model.forward()
        for req in batch.reqs:
            req.complete_one()
        return self.sampler.run(logits[: batch.size], plan)

    def fast_path_for(self, batch: Batch) -> Optional[FastPath]:
        """The first of this engine's fast paths that can run `batch`; None: run it eagerly."""
        for attribute in _FAST_PATHS:
            fast = getattr(self, attribute, None)  # None: not built (or registered after this engine was)
            if fast is not None and fast.can_run(batch):
                return fast
        return None
