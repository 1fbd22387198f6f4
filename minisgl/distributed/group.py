"""Joining and leaving the tensor-parallel process group.

Tensors travel over NCCL when the ranks live on GPUs and over gloo on the CPU, so the same code
runs TP=2 on a laptop with two processes. The group is torch.distributed's default group; the
collectives in `comm.py` use it.

Rendezvous goes through a key-value store that rank 0 (or the launching process) hosts before
any worker starts: the OS picks its port, so two groups never race for one, and the host can
watch the store fill up while checking that no worker has died. Waiting inside torch's own
rendezvous instead would hang until the timeout if a worker crashed while starting.
"""

from __future__ import annotations

import datetime
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
import torch.distributed as dist

from minisgl.env import declare_switches, switch

from .info import TPInfo, set_tp_info


@dataclass(frozen=True)
class GroupSwitches:
    tp_timeout: float = field(default=300.0, metadata=switch(
        "seconds a tensor-parallel collective waits for a peer before it fails"))


# How long a collective may wait for a peer before it fails instead of hanging. Long enough for
# a slow first step (kernel compilation), short enough that a stuck peer is noticed.
DEFAULT_TIMEOUT_S = declare_switches(GroupSwitches).tp_timeout  # MINISGL_TP_TIMEOUT
_HOST = "127.0.0.1"


def host_store(timeout_s: float = DEFAULT_TIMEOUT_S) -> dist.TCPStore:
    """Start the rendezvous store (in rank 0's or the launcher's process); `.port` is its port."""
    return dist.TCPStore(_HOST, 0, is_master=True, timeout=datetime.timedelta(seconds=timeout_s),
                         wait_for_workers=False)


def join_store(port: int, timeout_s: float = DEFAULT_TIMEOUT_S) -> dist.TCPStore:
    return dist.TCPStore(_HOST, port, is_master=False, timeout=datetime.timedelta(seconds=timeout_s))


def wait_for_ranks(store: dist.TCPStore, ranks: range, check_alive: Callable[[], None],
                   timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Block until every rank in `ranks` has announced itself, calling `check_alive()` (which
    raises if a worker died) between looks."""
    keys = [f"joined/{r}" for r in ranks]
    deadline = time.monotonic() + timeout_s
    while not store.check(keys):
        check_alive()
        if time.monotonic() > deadline:
            raise TimeoutError(f"tensor-parallel ranks did not all start within {timeout_s:.0f} s")
        time.sleep(0.05)


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def init_tp_group(
    rank: int,
    size: int,
    store: Optional[dist.Store],
    device: torch.device,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> None:
    """Join the group of `size` ranks that meet at `store` (blocks until all have joined)."""
    info = TPInfo(rank, size)
    if size == 1:
        set_tp_info(info)
        return
    assert store is not None, "a group of several ranks needs a rendezvous store"
    if dist.is_initialized():
        raise RuntimeError(
            "this process already belongs to a tensor-parallel group: shut the previous "
            "tensor-parallel LLM down (llm.shutdown()) before starting another"
        )
    if device.type == "cuda":
        torch.cuda.set_device(device)
    store.set(f"joined/{rank}", "1")
    dist.init_process_group(backend_for(device), store=store, rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=timeout_s))
    set_tp_info(info)


def destroy_tp_group() -> None:
    """Leave the group (safe to call when none was joined)."""
    if dist.is_initialized():
        dist.destroy_process_group()
    set_tp_info(TPInfo())
