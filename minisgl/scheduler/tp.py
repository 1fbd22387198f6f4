"""Tensor parallelism for the scheduler: rank 0 leads, ranks 1..N-1 mirror it.

Design: every rank runs its own, identical scheduler. Only rank 0 hears from the user; before
each step it sends the other ranks the requests added or aborted since the last step, then all
ranks step together. Scheduling is deterministic (FCFS admission, decode set sorted by uid, KV
pool sizes agreed with a min over ranks, seeds sent explicitly), and every rank sees the same
logits (the LM head is all-gathered) and samples with the same hash of (seed, position), so all
ranks make the same decisions without shipping batches or tokens around. That is the whole
protocol: one small pipe message per step. To catch a broken assumption early, each rank folds
the tokens it samples into a checksum, and rank 0 compares checksums whenever it goes idle; with
integrity checks on, the ranks also prove before every forward pass that they hold the same batch.
"""

from __future__ import annotations

import os
import weakref
import zlib
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import Any, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from minisgl.core import Batch, SamplingParams
from minisgl.distributed.comm import all_reduce_max
from minisgl.distributed.info import TPInfo, set_tp_info
from minisgl.distributed.group import destroy_tp_group, host_store, init_tp_group, join_store, wait_for_ranks
from minisgl.distributed.launch import RankFailedError, RankProcesses, rank_device, recv_msg, report_error, send_msg
from minisgl.distributed.split import check_tp_split
from minisgl.models import ModelConfig

from .config import SchedulerConfig
from .scheduler import ForwardResult, extends_scheduler, scheduler_bases

READY_TIMEOUT_S = 600.0  # building a large model on a slow disk can take minutes

Command = Tuple[Any, ...]  # ("add", ids, params, uid, serialised grammar or None) | ("abort", uid)


def rank_config(config: SchedulerConfig, rank: int) -> SchedulerConfig:
    engine = config.engine
    return replace(config, engine=replace(engine, tp_rank=rank, device=rank_device(engine.device, rank)))


@extends_scheduler("tensor_parallel")
class TensorParallelMixin:
    """Put in front of `Scheduler` in a class's bases. With `tp_size == 1` it does nothing; on
    rank 0 of a larger group it starts the other ranks and mirrors requests to them."""

    def __init__(self, config: SchedulerConfig, *args: Any, **kwargs: Any):
        # *args / **kwargs: whatever the scheduler class behind the mixin takes (queue addresses)
        self._workers: Optional[RankProcesses] = None
        self._commands: List[Command] = []
        self._checksum = 0
        self._tp_size = config.engine.tp_size
        if config.engine.tp_rank == 0:
            config = rank_config(config, 0)  # "cuda" -> "cuda:0": each rank names its GPU
        if self._tp_size == 1 or config.engine.tp_rank != 0:
            super().__init__(config, *args, **kwargs)  # a single rank, or a follower built by `follower_main`
            return
        check_tp_split(ModelConfig.from_dir(config.engine.model_path), self._tp_size)
        if dist.is_initialized():  # checked before spawning: failing later would tear down the live group
            raise RuntimeError(
                "this process already leads a tensor-parallel group: call shutdown() on that LLM "
                "before starting another with tp_size > 1"
            )
        store = self._store = host_store()  # the group keeps using it after the rendezvous
        workers = RankProcesses.spawn(range(1, self._tp_size), self._tp_size, follower_main, (config, store.port))
        self._finalizer = weakref.finalize(self, _stop, workers)
        try:
            wait_for_ranks(store, range(1, self._tp_size), workers.raise_if_dead)
            init_tp_group(0, self._tp_size, store, config.engine.torch_device)
            super().__init__(config, *args, **kwargs)  # the engine agrees on the KV pool size with the others
            workers.recv_all("ready", READY_TIMEOUT_S)
        except BaseException as e:
            detail = workers.errors()
            self._finalizer()
            if detail and not isinstance(e, RankFailedError):
                raise RankFailedError(f"starting tensor-parallel ranks failed{detail}") from e
            raise
        self._workers = workers

    # ---- mirrored inputs ----------------------------------------------------------------------
    def add_request(self, input_ids: Sequence[int] | torch.Tensor, params: SamplingParams,
                    uid: Optional[int] = None) -> int:
        uid = super().add_request(input_ids, params, uid)
        if self._workers is not None:
            pending = self.prefill.pending[-1]
            assert pending.uid == uid
            # the seed drawn here goes along, so followers need not draw the same one
            wire = self.grammar.wire(params) if hasattr(self, "grammar") else None  # so followers need not compile
            self._commands.append(("add", pending.input_ids.tolist(), replace(params, seed=pending.seed), uid, wire))
        return uid

    def abort_request(self, uid: int) -> None:
        super().abort_request(uid)
        if self._workers is not None:
            self._commands.append(("abort", uid))

    def step(self) -> None:
        if self._workers is None:
            if self._tp_size > 1 and self.config.engine.tp_rank == 0:
                raise RankFailedError("this tensor-parallel LLM was shut down; create a new one")
            return super().step()
        commands, self._commands = self._commands, []
        try:
            self._workers.send_all(("step", commands))
            super().step()
            if self.is_idle:
                self._check_agreement()
        except BaseException as e:
            detail = self._workers.errors()
            self.shutdown()
            if isinstance(e, RankFailedError) or not detail:
                raise
            raise RankFailedError(f"a tensor-parallel step failed{detail}") from e

    def launch(self, batch: Batch) -> ForwardResult:
        # the layers read which rank they are from a process global; another engine built in this
        # process since (a TP=1 reference in a notebook, say) may have changed it
        set_tp_info(TPInfo(self.config.engine.tp_rank, self._tp_size))
        if self._tp_size > 1 and self.config.check_integrity:
            self._check_same_batch(batch)
        return super().launch(batch)

    def _check_same_batch(self, batch: Batch) -> None:
        """With integrity checks on: one tiny all-reduce per step proves every rank is about to run
        the same batch. Without it, diverged ranks would feed collectives of different sizes,
        which hang until the group's timeout instead of failing."""
        shape = [(r.uid, r.cached_len, r.extend_len) for r in batch.reqs]
        sig = zlib.crc32(repr((batch.phase, shape)).encode())
        t = torch.tensor([sig, -sig], dtype=torch.int64, device=self.device)
        all_reduce_max(t)
        if t[0].item() != sig or -t[1].item() != sig:
            raise RankFailedError(f"tensor-parallel ranks scheduled different batches at step {self._step}; this "
                                  f"rank's: {batch.phase} {shape}")

    def process_results(self, result: ForwardResult) -> None:
        super().process_results(result)
        if self._tp_size > 1:
            tokens = result.next_tokens.to(torch.int32).numpy().tobytes()
            self._checksum = zlib.crc32(tokens, self._checksum)

    def _check_agreement(self) -> None:
        """Rank 0 is idle: every other rank must be idle too, having sampled the same tokens."""
        self._workers.send_all(("checksum", None))
        theirs = self._workers.recv_all("checksum", READY_TIMEOUT_S)
        if any(t != (self._checksum, True) for t in theirs):
            raise RankFailedError(
                f"tensor-parallel ranks diverged: (token checksum, idle) is {(self._checksum, True)} on rank 0, "
                f"{theirs} on the others"
            )

    def shutdown(self) -> None:
        """Stop the other ranks and leave the process group (idempotent)."""
        workers, self._workers = self._workers, None
        if workers is not None:
            self._finalizer()


def _stop(workers: RankProcesses) -> None:
    workers.shutdown()
    destroy_tp_group()


class _Follower(*scheduler_bases()):
    """A rank > 0: the same scheduler as rank 0's, whose tokens go nowhere (rank 0 reports them)."""

    def apply(self, command: Command) -> None:
        if command[0] == "add":
            _, ids, params, uid, wire = command
            if wire is not None:
                self.grammar.accept(params, wire)  # rank 0's grammar: nothing to compile on this loop
            self.add_request(ids, params, uid)
        elif command[0] == "abort":
            self.abort_request(command[1])
        else:
            raise ValueError(f"unknown command {command[0]!r}")


def follower_main(rank: int, size: int, conn: Connection, config: SchedulerConfig, port: int) -> None:
    """Body of rank `rank`'s process: join the group, build the scheduler, obey rank 0."""
    try:
        config = rank_config(config, rank)
        device = config.engine.torch_device
        if device.type == "cpu":
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // size))  # ranks share the cores
        init_tp_group(rank, size, join_store(port), device)
        scheduler = _Follower(config)
        send_msg(conn, ("ready", None))
        while True:
            kind, payload = recv_msg(conn)
            if kind == "shutdown":
                break
            if kind == "step":
                for command in payload:
                    scheduler.apply(command)
                scheduler.step()
            elif kind == "checksum":
                send_msg(conn, ("checksum", (scheduler._checksum, scheduler.is_idle)))
    except EOFError:
        pass  # rank 0 is gone: nothing left to serve
    except BaseException:
        report_error(conn)
    finally:
        destroy_tp_group()
