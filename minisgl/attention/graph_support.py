"""How an attention backend takes part in CUDA graphs, declared per backend class.

A captured graph replays kernels that read fixed addresses, so a backend whose metadata is
planned into fresh tensors each batch cannot be replayed as it is. A backend that can be captured
registers, for its class, a maker of its graph support: an object built once for the ladder of
captured batch sizes, owning the fixed buffers its kernels will read, which fills them before
the capture of each size and before every replay. A backend with no support registered (the
torch backend) is never captured: its decode steps run eagerly.

The size a batch is padded to is the graph's, not the batch's: the runner picks, for each replay,
the captured size that holds the batch, and passes it to the support's `prepare_for_*` calls. A
batch holds only its real requests; the padding requests exist only in what the support plans.

`graph_support_for` looks along the backend's class hierarchy, so a subclass without support of
its own is captured as its parent is. FlashInfer's support is a module of its own, loaded when
first asked for; a backend defined after this chapter registers its support where it is defined.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Tuple, TypeVar

from minisgl.utils import package_has

from .base import BaseAttnBackend

if TYPE_CHECKING:
    import torch

    from minisgl.core import Batch

FLASHINFER_GRAPHS_MODULE = "minisgl.attention.flashinfer_graphs"  # registers FlashInfer's support


class AttnGraphSupport(ABC):
    """One backend's fixed buffers for every captured batch size, and how it fills them."""

    def prepare_for_capture(self, batch: "Batch", size: int) -> None:
        """Set `batch.attn_metadata` for the capture of the graph of `size` rows, every one of them
        padding; by default exactly as for a replay."""
        self.prepare_for_replay(batch, size)

    @abstractmethod
    def prepare_for_replay(self, batch: "Batch", size: int) -> None:
        """Plan `batch`, padded to `size` rows (the captured size about to be replayed), into the
        buffers the graph of that size reads, and set `batch.attn_metadata` to what its kernels
        were captured with."""


# (backend, largest captured batch size, the captured sizes) -> the backend's graph support
MakeGraphSupport = Callable[[BaseAttnBackend, int, List[int]], AttnGraphSupport]
_Maker = TypeVar("_Maker", bound=MakeGraphSupport)

_SUPPORT: Dict[type, MakeGraphSupport] = {}


def graph_support(backend_cls: type) -> Callable[[_Maker], _Maker]:
    """Register how backends of `backend_cls` (and of subclasses that register nothing) are captured.
    Registering a class again (a module imported afresh) replaces its maker."""

    def register(make: _Maker) -> _Maker:
        _SUPPORT[backend_cls] = make
        return make

    return register


def graph_support_for(backend: BaseAttnBackend) -> Optional[MakeGraphSupport]:
    """The maker registered for the backend's class or its nearest ancestor; None: never captured."""
    if package_has(FLASHINFER_GRAPHS_MODULE):
        importlib.import_module(FLASHINFER_GRAPHS_MODULE)
    for cls in type(backend).__mro__:
        if cls in _SUPPORT:
            return _SUPPORT[cls]
    return None


def dummy_row_of(page_table: "torch.Tensor") -> int:
    """The page table's dummy row, its last: every slot of it is on the zeroed dummy page."""
    return page_table.shape[0] - 1


def padded_rows(batch: "Batch", size: int, dummy_row: int) -> Tuple[List[int], List[int]]:
    """Page-table rows and key counts of `batch` in the graph of `size` rows: the batch's requests,
    then one padding request per row up to `size`, each on the dummy row with one key (its own slot)."""
    pad = size - batch.size
    if pad < 0:
        raise ValueError(f"padded size {size} is below the batch size {batch.size}: plan the replay for a "
                         "captured size that holds the batch (GraphRunner.padded_size)")
    rows = [r.table_idx for r in batch.reqs] + [dummy_row] * pad
    kv_lens = [r.device_len for r in batch.reqs] + [1] * pad
    return rows, kv_lens
