"""Cases for io-loop: the server loop driven through stand-in queues, on the tiny model.

The PULL socket is replaced by a scripted inbox (deliveries due after so many steps; a loop that
waits in `poll` receives the next delivery early, as a real one would), the PUSH socket by a list.
Every poll timeout, every delivery, every step and every send is recorded, in order.
"""

import random
import shutil
import tempfile
from typing import Any, List, Tuple

import torch

from judge import harness
from judge.api import E2E, Obs, case
from minisgl.core import SamplingParams
from minisgl.message import (AbortMsg, BatchMsg, DetokenizeMsg, ExitMsg, SchedulerErrorMsg, StatusMsg, StatusQuery,
                             UserMsg)

MAX_SPINS = 50  # polls in a row that deliver nothing before the case gives up on the loop


class LoopStuck(RuntimeError):
    pass


def describe(msg: Any) -> Any:
    """A message as a plain list, in the learner's terms."""
    if isinstance(msg, BatchMsg):
        return ["BatchMsg", [describe(m) for m in msg.msgs]]
    if isinstance(msg, DetokenizeMsg):
        return ["DetokenizeMsg", msg.uid, msg.token, msg.finish_reason]
    if isinstance(msg, SchedulerErrorMsg):
        return ["SchedulerErrorMsg", msg.uid, msg.message]
    if isinstance(msg, StatusMsg):
        return ["StatusMsg", msg.uid, {"idle": msg.idle, "live_requests": msg.live_requests, "free_rows": msg.free_rows,
                                       "integrity_ok": msg.integrity_ok, "aborted_requests": msg.aborted_requests}]
    if isinstance(msg, UserMsg):
        return ["UserMsg", msg.uid, len(msg.input_ids)]
    if hasattr(msg, "uid"):
        return [type(msg).__name__, msg.uid]
    return [type(msg).__name__]


class ScriptedInbox:
    """Stands in for the PULL socket (`receive` calls `.socket.poll(ms)` and `.get_nowait()`)."""

    def __init__(self, sched, deliveries: List[Tuple[int, list]], log: list):
        self.sched, self.pending, self.due, self.log = sched, list(deliveries), [], log
        self.socket = self
        self.spins = 0

    def _release(self) -> None:
        while self.pending and self.pending[0][0] <= self.sched.steps_run:
            self.due.extend(self.pending.pop(0)[1])

    def poll(self, timeout_ms: int) -> int:
        self.log.append(["poll", int(timeout_ms)])
        self._release()
        if not self.due and timeout_ms > 0 and self.pending:
            self.due.extend(self.pending.pop(0)[1])  # it arrives while the loop waits
        if self.due:
            self.spins = 0
            return 1
        self.spins += 1
        if self.spins >= MAX_SPINS:
            if self.pending:
                raise LoopStuck(f"{MAX_SPINS} polls in a row without waiting while nothing can run: "
                                "an idle loop must block in receive until a message comes")
            raise LoopStuck(f"the loop is still polling {MAX_SPINS} times after the last message of the script (an ExitMsg)")
        return 0

    def get_nowait(self) -> list:
        self._release()
        out, self.due = self.due, []
        self.log.append(["received", [describe(m) for m in out]])
        return out

    def close(self) -> None:
        pass


class SentList:
    """Stands in for the PUSH socket."""

    def __init__(self, log: list):
        self.log = log

    def put(self, msg: Any) -> None:
        self.log.append(["send", describe(msg)])

    def close(self) -> None:
        pass


def make_io(log: list, deliveries, **config):
    """A SchedulerIO on the tiny model with its two sockets swapped for the stand-ins."""
    from minisgl.scheduler.io import SchedulerIO

    folder = tempfile.mkdtemp(prefix="io-loop-")
    sched = SchedulerIO(harness.scheduler_config(**config), f"ipc://{folder}/in", f"ipc://{folder}/out")
    sched.recv_queue.close()
    sched.send_queue.close()
    shutil.rmtree(folder, ignore_errors=True)  # the sockets are closed: nothing will use the folder again
    sched.steps_run = 0
    engine_step = type(sched).step

    def step() -> None:
        before = len(sched.trace)
        engine_step(sched)
        sched.steps_run += 1
        log.append(["step", [[t.phase, t.uids] for t in sched.trace[before:]]])

    sched.step = step
    sched.recv_queue = ScriptedInbox(sched, deliveries, log)
    sched.send_queue = SentList(log)
    return sched


def run_loop(obs: Obs, label: str, deliveries, parent_pid=None, **config) -> None:
    log: list = []
    sched = make_io(log, deliveries, **config)
    try:
        sched.run_forever(parent_pid) if parent_pid is not None else sched.run_forever()
        log.append(["returned"])
    except LoopStuck as e:
        log.append(["stuck", str(e)])
    except Exception as e:  # the learner's loop died: what killed it is the observation
        log.append(["raised", type(e).__name__, str(e)])
    obs.eq(f"{label}: the loop's events in order (poll timeout in ms, messages received, steps, sends)", log)
    obs.eq(f"{label}: messages left in the outbox", [describe(m) for m in sched.outbox])
    obs.eq(f"{label}: self.running at the end", sched.running)
    if log[-1] == ["returned"] and sched.is_idle:
        sched.assert_all_free()


def user(uid: int, prompt: List[int], max_tokens: int) -> UserMsg:
    return UserMsg(uid, torch.tensor(prompt, dtype=torch.int32), SamplingParams(max_tokens=max_tokens, ignore_eos=True))


@case("handle: every kind of message, one by one", hint=1)
def handle_each(obs: Obs) -> None:
    log: list = []
    sched = make_io(log, [])
    msgs = [user(0, [11, 12, 13], 4), user(1, list(range(5, 300)), 8), StatusQuery(2), AbortMsg(0),
            BatchMsg([user(3, [21, 22], 2), BatchMsg([AbortMsg(3), StatusQuery(4)])]), AbortMsg(99), ExitMsg()]
    for m in msgs:
        sched.handle(m)
        obs.eq(f"after handle({describe(m)}): outbox", [describe(x) for x in sched.outbox])
        obs.eq(f"after handle({describe(m)}): waiting uids, running flag", [[p.uid for p in sched.prefill.pending], sched.running])
    try:
        sched.handle(DetokenizeMsg(5, 7))
        obs.eq("handle(DetokenizeMsg): raised", None)
    except TypeError:
        obs.eq("handle(DetokenizeMsg): raised", "TypeError")


@case("flush: nothing, one message, several", hint=2)
def flush_each(obs: Obs) -> None:
    log: list = []
    sched = make_io(log, [])
    for outbox in ([], [DetokenizeMsg(0, 5)], [DetokenizeMsg(0, 5), DetokenizeMsg(1, None, "abort"), SchedulerErrorMsg(2, "no")]):
        sched.outbox = list(outbox)
        sched.flush()
        obs.eq(f"flush() of {len(outbox)} messages: sends so far", log)
        obs.eq(f"flush() of {len(outbox)} messages: outbox after", [describe(m) for m in sched.outbox])


@case("three requests, then an exit", kind=E2E, hint=3)
def three_requests(obs: Obs) -> None:
    first = BatchMsg([user(0, [11, 12, 13], 4), user(1, [21, 22], 2), user(2, [31, 32, 33, 34], 3)])
    run_loop(obs, "three requests", [(0, [first]), (4, [ExitMsg()])])


@case("requests arrive while others decode; an idle query; exit", kind=E2E, hint=3)
def arrivals(obs: Obs) -> None:
    deliveries = [(0, [user(0, [11, 12, 13], 5)]), (2, [user(1, [21, 22], 3)]), (3, [StatusQuery(7)]),
                  (6, [StatusQuery(8)]), (7, [ExitMsg()])]
    run_loop(obs, "arrivals", deliveries)


@case("a refusal, an abort of a running and of a waiting request, replies while idle", kind=E2E, hint=4)
def aborts_and_refusals(obs: Obs) -> None:
    deliveries = [(0, [user(10, list(range(5, 25)), 50)]),
                  (1, [BatchMsg([user(11, [5, 6, 7, 8], 50), AbortMsg(11), AbortMsg(10)])]),
                  (2, [user(12, list(range(5, 300)), 8)]),
                  (3, [BatchMsg([StatusQuery(13), ExitMsg(), StatusQuery(14)])])]
    run_loop(obs, "aborts and a refusal", deliveries)


@case("an orphaned loop returns once idle", hint=3)
def orphan(obs: Obs) -> None:
    run_loop(obs, "parent gone, nothing to do", [], parent_pid=-1)
    run_loop(obs, "parent gone, one request first", [(0, [user(0, [3, 4], 2)])], parent_pid=-1)


@case("random arrivals, aborts and queries", kind=E2E, seeds=2, hint=3)
def random_script(obs: Obs, seed: int) -> None:
    rng = random.Random(seed)
    prompts = harness.random_prompts(seed, 6, lo=1, hi=10)
    deliveries, uid, at = [], 0, 0
    for _ in range(rng.randint(3, 6)):
        msgs = []
        for _ in range(rng.randint(1, 3)):
            kind = rng.random()
            if kind < 0.6:
                msgs.append(user(uid, prompts[uid % len(prompts)], rng.randint(1, 5)))
                uid += 1
            elif kind < 0.8 and uid:
                msgs.append(AbortMsg(rng.randrange(uid)))
            else:
                msgs.append(StatusQuery(1000 + len(deliveries)))
        deliveries.append((at, [msgs[0]] if len(msgs) == 1 else [BatchMsg(msgs)]))
        at += rng.randint(0, 3)
    deliveries.append((at + 8, [ExitMsg()]))
    run_loop(obs, f"script of {len(deliveries)} deliveries", deliveries, max_running_reqs=rng.choice([2, 8]))
