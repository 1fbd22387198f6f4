"""Starting, talking to and stopping the other ranks' processes.

Workers are spawned, never forked: a forked child inherits CUDA and thread-pool state it cannot
use. Each worker gets one end of a pipe for control messages `(kind, payload)`; tensors go
through the process group. The pipe also ties a worker's life to its parent: when the parent
dies its end closes, the worker's `recv` fails and the worker exits, so none is left orphaned.
A worker that fails sends `("error", traceback)` before it exits, and the parent raises
`RankFailedError` with that traceback instead of waiting for an answer that never comes.
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

from .group import destroy_tp_group, host_store, init_tp_group, join_store

_CTX = mp.get_context("spawn")


class RankFailedError(RuntimeError):
    """A tensor-parallel worker died or raised; the message carries its traceback."""


def rank_device(device: str, rank: int) -> str:
    """Each rank's device: one GPU per rank, counted from the one named ("cuda" is "cuda:0")."""
    if not device.startswith("cuda"):
        return device
    first = int(device.partition(":")[2] or 0)
    return f"cuda:{first + rank}"


def send_msg(conn: Connection, msg: Any) -> None:
    """Plain pickle, not the multiprocessing pickler: that one passes tensors as shared-memory
    handles, which die with the sender (a worker may exit right after sending its result)."""
    conn.send_bytes(pickle.dumps(msg))


def recv_msg(conn: Connection) -> Any:
    return pickle.loads(conn.recv_bytes())


def report_error(conn: Connection) -> None:
    """Called by a worker inside `except`: send the traceback to the parent (best effort)."""
    try:
        send_msg(conn, ("error", traceback.format_exc()))
    except (BrokenPipeError, OSError):
        pass


@dataclass
class RankProcesses:
    """Handles to spawned workers; `ranks[i]` is the rank of worker i."""

    ranks: List[int] = field(default_factory=list)
    procs: List[Any] = field(default_factory=list)  # multiprocessing Process objects
    conns: List[Connection] = field(default_factory=list)
    closed: bool = False

    @classmethod
    def spawn(cls, ranks: Sequence[int], size: int, target: Callable[..., None],
              args: Sequence[Any]) -> "RankProcesses":
        """Start one process per rank in `ranks`, each running `target(rank, size, conn, *args)`."""
        group = cls()
        try:
            for rank in ranks:
                ours, theirs = _CTX.Pipe(duplex=True)
                proc = _CTX.Process(target=target, args=(rank, size, theirs, *args), name=f"minisgl-tp{rank}",
                                    daemon=True)
                proc.start()
                theirs.close()  # only the child holds it now: its exit closes the pipe
                group.ranks.append(rank)
                group.procs.append(proc)
                group.conns.append(ours)
        except BaseException:
            group.shutdown()
            raise
        return group

    def send_all(self, msg: Any) -> None:
        self.raise_if_dead()
        for rank, conn in zip(self.ranks, self.conns):
            try:
                send_msg(conn, msg)
            except (BrokenPipeError, OSError):
                raise RankFailedError(f"tensor-parallel rank {rank} is gone{self._pending_error(rank)}") from None

    def recv_all(self, kind: str, timeout_s: Optional[float] = None) -> List[Any]:
        """One `(kind, payload)` reply from every worker, in rank order. Waits on all workers at
        once, so a worker that dies is noticed even while another one is still busy."""
        got: Dict[int, Any] = {}
        waiting = {conn: i for i, conn in enumerate(self.conns)}
        sentinels = {proc.sentinel: i for i, proc in enumerate(self.procs)}
        while waiting:
            ready = wait(list(waiting) + [s for s, i in sentinels.items() if i in waiting.values()], timeout_s)
            if not ready:
                late = [self.ranks[i] for i in waiting.values()]
                raise RankFailedError(f"tensor-parallel ranks {late} did not answer within {timeout_s} s")
            for obj in ready:
                if obj in waiting:
                    i = waiting.pop(obj)
                    got[i] = self._read(i, kind)
                elif sentinels.get(obj) in waiting.values():
                    i = sentinels[obj]
                    if not self.conns[i].poll(0):  # died without a last word
                        raise RankFailedError(f"tensor-parallel rank {self.ranks[i]} exited (code "
                                              f"{self.procs[i].exitcode}) without answering")
        return [got[i] for i in range(len(self.conns))]

    def _read(self, i: int, kind: str) -> Any:
        rank = self.ranks[i]
        try:
            got, payload = recv_msg(self.conns[i])
        except EOFError:
            raise RankFailedError(f"tensor-parallel rank {rank} exited (code {self.procs[i].exitcode}) without "
                                  "answering") from None
        if got == "error":
            raise RankFailedError(f"tensor-parallel rank {rank} failed:\n{payload}")
        assert got == kind, f"rank {rank} answered {got!r}, expected {kind!r}"
        return payload

    def raise_if_dead(self) -> None:
        for rank, proc in zip(self.ranks, self.procs):
            if not proc.is_alive():
                raise RankFailedError(f"tensor-parallel rank {rank} is gone (exit code "
                                      f"{proc.exitcode}){self._pending_error(rank)}")

    def _pending_error(self, rank: int) -> str:
        """The error a failed worker sent before it went, if any."""
        conn = self.conns[self.ranks.index(rank)]
        try:
            while conn.poll(0):
                kind, payload = recv_msg(conn)
                if kind == "error":
                    return f":\n{payload}"
        except (EOFError, OSError):
            pass
        return ""

    def errors(self) -> str:
        """Every error the workers have reported so far (for the message when the parent fails)."""
        return "".join(self._pending_error(r) for r in self.ranks)

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Ask every worker to stop, then make sure it has: join, terminate, kill."""
        if self.closed:
            return
        self.closed = True
        for conn in self.conns:
            try:
                send_msg(conn, ("shutdown", None))
            except (BrokenPipeError, OSError):
                pass
        for proc in self.procs:
            proc.join(timeout_s)
            if proc.is_alive():
                proc.terminate()
                proc.join(5.0)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for conn in self.conns:
            conn.close()


def _run_rank(rank: int, size: int, conn: Connection, fn: Callable[[int, int], Any], port: int, device: str) -> None:
    try:
        init_tp_group(rank, size, join_store(port), torch.device(rank_device(device, rank)))
        send_msg(conn, ("result", fn(rank, size)))
    except BaseException:
        report_error(conn)
    finally:
        destroy_tp_group()


def run_on_ranks(fn: Callable[[int, int], Any], size: int, device: str = "cpu", timeout_s: float = 600.0) -> List[Any]:
    """Run `fn(rank, size)` in `size` fresh processes joined in one group; return every rank's
    result in rank order. `fn` must be importable (defined at module level) and its result
    picklable. For experiments and tests; `LLM(tp_size=N)` keeps its workers alive instead."""
    store = host_store()  # lives here, so the ranks can meet even if rank 0 is slow to start
    group = RankProcesses.spawn(range(size), size, _run_rank, (fn, store.port, device))
    try:
        return group.recv_all("result", timeout_s)
    finally:
        group.shutdown()
        del store
