"""Chapter 14: the scheduler behind a socket.

Oracle: the offline `LLM` on the same token ids (both tiny-llama, greedy). The test stands in
for the tokenizer worker: it pushes `UserMsg`s into the scheduler's socket and reads the
`DetokenizeMsg`s that come back, while the scheduler runs its loop in a thread.
"""

from __future__ import annotations

import random
import threading
from typing import Dict, List

import pytest
import torch

from minisgl.core import SamplingParams
from minisgl.engine import EngineConfig
from minisgl.llm import LLM
from minisgl.message import AbortMsg, BatchMsg, DetokenizeMsg, ExitMsg, SchedulerErrorMsg, StatusMsg, StatusQuery, UserMsg
from minisgl.scheduler import SchedulerConfig
from minisgl.scheduler.io import SchedulerIO
from minisgl.utils.mp import ZmqPullQueue, ZmqPushQueue

from helpers import MODELS

TINY = str(MODELS / "tiny-llama")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ipc")
    recv, send = f"ipc://{folder}/in", f"ipc://{folder}/out"
    config = SchedulerConfig(engine=EngineConfig(model_path=TINY, max_running_reqs=16, cpu_kv_budget_gb=0.25))
    sched = SchedulerIO(config, recv, send)
    to_sched, from_sched = ZmqPushQueue(recv, bind=False), ZmqPullQueue(send, bind=True)
    thread = threading.Thread(target=sched.run_forever, daemon=True)
    thread.start()
    yield to_sched, from_sched
    to_sched.put(ExitMsg())
    thread.join(30)
    assert not thread.is_alive(), "the scheduler loop did not stop on ExitMsg"


def collect(from_sched: ZmqPullQueue, until_done: set, timeout_s: float = 120) -> Dict[int, List]:
    """Messages by uid, until every uid in `until_done` has a finish reason (or an error)."""
    got: Dict[int, List] = {}
    pending = set(until_done)
    while pending:
        msg = from_sched.get(timeout_s=timeout_s)
        for m in msg.msgs if isinstance(msg, BatchMsg) else [msg]:
            got.setdefault(m.uid, []).append(m)
            if isinstance(m, SchedulerErrorMsg) or (isinstance(m, DetokenizeMsg) and m.finish_reason):
                pending.discard(m.uid)
    return got


def status(to_sched, from_sched, uid: int) -> StatusMsg:
    to_sched.put(StatusQuery(uid))
    while True:
        msg = from_sched.get(timeout_s=30)
        if isinstance(msg, StatusMsg):
            return msg


def test_requests_over_the_socket_match_the_offline_llm(served):
    to_sched, from_sched = served
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 49152) for _ in range(rng.randint(1, 30))] for _ in range(20)]
    params = [SamplingParams(max_tokens=rng.randint(1, 10)) for _ in prompts]
    to_sched.put(BatchMsg([UserMsg(100 + i, torch.tensor(p, dtype=torch.int32), sp) for i, (p, sp) in enumerate(zip(prompts, params))]))
    got = collect(from_sched, {100 + i for i in range(20)})
    ref = LLM(TINY, max_running_reqs=16, cpu_kv_budget_gb=0.25).generate(prompts, params)
    for i, out in enumerate(ref):
        msgs = got[100 + i]
        assert [m.token for m in msgs] == out.token_ids
        assert [m.finish_reason for m in msgs] == [None] * (len(msgs) - 1) + [out.finish_reason]
    st = status(to_sched, from_sched, 999)
    assert st.idle and st.live_requests == 0 and st.integrity_ok
    assert st.free_rows == st.total_rows == 16
    assert st.free_pages + st.cached_pages == st.total_pages


def test_abort_frees_a_running_request_and_a_waiting_one(served):
    to_sched, from_sched = served
    long = SamplingParams(max_tokens=1000, ignore_eos=True)
    to_sched.put(UserMsg(200, torch.arange(5, 25, dtype=torch.int32), long))
    first = from_sched.get(timeout_s=60)  # it is running once a token comes back
    assert any(m.uid == 200 for m in (first.msgs if isinstance(first, BatchMsg) else [first]))
    to_sched.put(BatchMsg([UserMsg(201, torch.arange(5, 9, dtype=torch.int32), long), AbortMsg(201), AbortMsg(200)]))
    got = collect(from_sched, {200, 201})
    assert got[200][-1] == DetokenizeMsg(200, None, "abort") and len(got[200]) < 1000
    assert got[201] == [DetokenizeMsg(201, None, "abort")]  # aborted before it was admitted
    st = status(to_sched, from_sched, 998)
    assert st.aborted_requests == 2
    assert st.idle and st.free_rows == st.total_rows and st.free_pages + st.cached_pages == st.total_pages and st.integrity_ok


def test_a_request_that_can_never_fit_is_refused_and_the_loop_goes_on(served):
    to_sched, from_sched = served
    to_sched.put(UserMsg(300, torch.arange(5, 2005, dtype=torch.int32), SamplingParams(max_tokens=100)))
    to_sched.put(UserMsg(301, torch.arange(5, 10, dtype=torch.int32), SamplingParams(max_tokens=3)))
    got = collect(from_sched, {300, 301})
    (err,) = got[300]
    assert isinstance(err, SchedulerErrorMsg) and "2000 tokens" in err.message and "2048" in err.message
    assert [m.finish_reason for m in got[301]] == [None, None, "length"]


# ---- the chapter's exercise, io-loop ---------------------------------------------------------
@pytest.mark.parametrize("variant, case_name, where", [
    ("never_block", "three requests, then an exit", "poll timeout"),
    ("always_block", "three requests, then an exit", "poll timeout"),
    ("flush_after_step", "requests arrive while others decode; an idle query; exit", "the loop's events"),
])
def test_io_loop_tells_a_spinning_or_blocking_loop_apart(variant, case_name, where):
    from judge import grade, variants

    path = variants.variant_file("io-loop", variant)
    result = grade("io-loop", path, seed=3, save=False)
    failing = [c for c in result.cases if c.status != "pass"]
    assert failing, f"{variant} passed every case"
    first = failing[0]
    assert first.name == case_name and where in first.where, (first.name, first.where)
