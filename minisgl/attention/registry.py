"""Pick an attention backend by name.

Each backend registers itself where it is defined (`attention_backend`), with a priority and a check of
whether it can run a given KV cache. "auto" takes the registered backend of highest priority whose check
passes; the torch backend, the reference path that runs everything, has the lowest. The registry finds the
backends itself: on first use it imports every module of this package named `*_backend`, so a backend
module added later joins by being there, and heavy GPU modules are imported only when a backend is asked for.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple, TypeVar

import torch

from minisgl.kvcache.mha_pool import MHAKVCache

from .base import BaseAttnBackend

# (device, dtype, head_dim) of the KV cache -> why the backend cannot run it, or None if it can
Problem = Callable[[torch.device, torch.dtype, int], Optional[str]]
_Maker = TypeVar("_Maker", bound=Callable[..., BaseAttnBackend])


@dataclass(frozen=True)
class BackendEntry:
    make: Callable[..., BaseAttnBackend]  # (kv_cache, page_table, **engine's keyword arguments) -> backend
    priority: int  # "auto" takes the runnable backend with the highest
    problem: Problem


_BACKENDS: Dict[str, BackendEntry] = {}


def _runs_anywhere(device: torch.device, dtype: torch.dtype, head_dim: int) -> Optional[str]:
    return None


def attention_backend(name: str, priority: int = 0, problem: Problem = _runs_anywhere) -> Callable[[_Maker], _Maker]:
    """Decorator: register a backend class (or a maker of one) under `name`. Registering a name again (a
    module imported afresh) replaces it."""

    def register(make: _Maker) -> _Maker:
        _BACKENDS[name] = BackendEntry(make, priority, problem)
        return make

    return register


def _discover() -> None:
    """Import every backend module this package holds: each registers itself when imported."""
    for module in pkgutil.iter_modules(importlib.import_module(__package__).__path__):
        if module.name.endswith("_backend"):
            importlib.import_module(f"{__package__}.{module.name}")


def backend_names() -> Tuple[str, ...]:
    """The names `attention_backend` accepts: "auto", then the registered backends, slowest first."""
    _discover()
    return ("auto", *sorted(_BACKENDS, key=lambda n: _BACKENDS[n].priority))


def resolve_backend_name(name: str, device: torch.device, dtype: torch.dtype = torch.bfloat16,
                         head_dim: int = 128) -> str:
    if name != "auto":
        return name
    _discover()
    problems = {n: entry.problem(device, dtype, head_dim) for n, entry in _BACKENDS.items()}
    runnable = [(_BACKENDS[n].priority, n) for n, problem in problems.items() if problem is None]
    if not runnable:
        why = "; ".join(f"{n}: {p}" for n, p in problems.items())
        raise ValueError(f"no attention backend runs on {device} with {dtype} and head size {head_dim} ({why}); "
                         "name a backend and fix what keeps it from running")
    return max(runnable)[1]


def create_attention_backend(name: str, kv_cache: MHAKVCache, page_table: torch.Tensor, **kwargs) -> BaseAttnBackend:
    name = resolve_backend_name(name, page_table.device, kv_cache.buffer.dtype, kv_cache.head_dim)
    names = backend_names()
    if name not in _BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}: this package holds {', '.join(names)}; choose one of "
                         "them ('auto' takes the fastest that runs here)")
    return _BACKENDS[name].make(kv_cache, page_table, **kwargs)
