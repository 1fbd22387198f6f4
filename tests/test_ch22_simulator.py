"""Chapter 22's page-accounting simulator (`chapters/gap.py:simulate`) against the real engine.

Claims: at `ratio=1.0` the simulator's steps are the engine's (`Scheduler.trace`), step for step,
on traffic where admission passes over a request refused for pages: the short requests behind it
are admitted, it is passed over at most `MAX_PASSED_OVER` times and then blocks the queue until it
fits, and a prompt longer than the step's token budget left stops the walk; the simulator reads
that bound from the engine, so changing it changes both.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "chapters"))
import gap  # noqa: E402


def _engine_steps(reqs: List[gap.SimReq], pages: int, rows: int, budget: Optional[int] = None) -> List[gap.SimStep]:
    from minisgl.core import SamplingParams
    from minisgl.engine import EngineConfig
    from minisgl.llm import LLM
    from minisgl.scheduler import SchedulerConfig

    engine = EngineConfig(model_path=str(REPO / "models" / "tiny-llama"), max_running_reqs=rows, max_seq_len=128,
                          num_pages=pages, dtype="float32")
    cfg = SchedulerConfig(engine=engine, prefix_cache="naive", overlap=False, max_extend_tokens=budget)
    llm = gap.stop_after(LLM, {r.uid: r.output for r in reqs})(config=cfg)
    # distinct tokens per request: nothing to share even if a cache kept prefixes
    outs = llm.generate([[7 + (r.uid * 37 + i) % 900 for i in range(r.prompt)] for r in reqs],
                        [SamplingParams(max_tokens=r.max_tokens, ignore_eos=True) for r in reqs])
    assert [len(o.token_ids) for o in outs] == [r.output for r in reqs]
    llm.assert_all_free()
    return gap.engine_steps(llm.trace)


def _big_then_short(shorts: int) -> List[gap.SimReq]:
    """Request 0 holds most of the pool; request 1 needs nearly as much and is refused until 0
    finishes; `shorts` short requests wait behind it."""
    big = [gap.SimReq(0, 8, 40, 40), gap.SimReq(1, 8, 40, 4)]
    return big + [gap.SimReq(2 + i, 4, 3, 3) for i in range(shorts)]


def _steps(sim: gap.SimResult) -> List[tuple]:
    return [(s.phase, s.uids) for s in sim.steps]


def test_short_requests_go_past_a_request_refused_for_pages():
    reqs = _big_then_short(3)
    engine = _engine_steps(reqs, pages=70, rows=4)
    assert engine[0].uids == [0, 2, 3, 4]  # request 1 (47 pages) does not fit beside 0; the short ones do
    assert _steps(gap.simulate(reqs, num_pages=70, max_running=4)) == [(s.phase, s.uids) for s in engine]


def test_a_request_passed_over_max_passed_over_times_blocks_the_queue():
    from minisgl.scheduler.prefill import MAX_PASSED_OVER

    reqs = _big_then_short(4 * MAX_PASSED_OVER)  # more short requests than 3 a pass for MAX_PASSED_OVER passes
    engine = _engine_steps(reqs, pages=70, rows=4)
    assert _steps(gap.simulate(reqs, num_pages=70, max_running=4)) == [(s.phase, s.uids) for s in engine]
    prefills = [i for i, s in enumerate(engine) if s.phase == "prefill"]
    admits_1 = next(i for i in prefills if 1 in engine[i].uids)
    assert prefills.index(admits_1) == MAX_PASSED_OVER  # passed over by each prefill step before
    # then it blocks: request 0 decodes alone, rows free and short requests waiting, until 1 fits
    blocked = engine[prefills[MAX_PASSED_OVER - 1] + 1:admits_1]
    assert blocked and {tuple(s.uids) for s in blocked[-3:]} == {(0,)}
    assert engine[admits_1].uids[0] == 1 and len(engine[admits_1].uids) > 1


def test_the_bound_is_the_engines(monkeypatch: pytest.MonkeyPatch):
    from minisgl.scheduler import prefill

    reqs = _big_then_short(12)
    monkeypatch.setattr(prefill, "MAX_PASSED_OVER", 2)
    assert _steps(gap.simulate(reqs, num_pages=70, max_running=4)) == [(s.phase, s.uids) for s in _engine_steps(reqs, 70, 4)]


def test_a_prompt_longer_than_the_budget_left_stops_the_walk():
    # request 1 is refused for pages, 2 fits, 3 would overrun the budget left and leads the next step
    reqs = [gap.SimReq(0, 8, 40, 6), gap.SimReq(1, 8, 40, 2), gap.SimReq(2, 10, 2, 2), gap.SimReq(3, 20, 2, 2),
            gap.SimReq(4, 4, 2, 2)]
    engine = _engine_steps(reqs, pages=70, rows=4, budget=24)
    assert engine[0].uids == [0, 2]
    assert _steps(gap.simulate(reqs, num_pages=70, max_running=4, token_budget=24)) == [(s.phase, s.uids) for s in engine]
