"""Chapter 22's exercise answers give numbers no cell prints: they are checked here, on the
chapter's own workload and engine settings (tiny-llama, four rows, six groups of four requests
sharing a 48-token prefix, `max_tokens=3`), and on its simulator.

Claims: answer 1 (200 pages: under both policies uid6 joins at step 1 as a hit of group 0; fcfs
computes 768 prompt tokens in 23 steps, uid7 and uid8 computing their prefix again at step 8; lpm
384 in 20, and the same when groups 3 to 5 start: at step 10, a hit joining at step 11);
answer 3 (without the in-batch wait, lpm at 400 pages computes 480 tokens in 18 steps, uid10 and
uid11 are prefilled at step 12 and uid16, uid17, uid22 and uid23 at step 15); answer 4 (ratio 0.05
retracts two requests, 0.06 none, with a mean batch of 40 against 14.6 at 1.0).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "chapters"))
import gap  # noqa: E402

PROMPTS = gap.shared_prefix_prompts(6, 4, 48, 4)
GROUP = {uid: uid % 6 for uid in range(len(PROMPTS))}


def _run(policy: str, pages: int):
    from minisgl.core import SamplingParams
    from minisgl.engine import EngineConfig
    from minisgl.llm import LLM
    from minisgl.scheduler import SchedulerConfig

    engine = EngineConfig(model_path=str(REPO / "models" / "tiny-llama"), max_running_reqs=4, max_seq_len=128,
                          num_pages=pages, dtype="float32")
    cfg = SchedulerConfig(engine=engine, schedule_policy=policy, overlap=False)
    llm = LLM(config=cfg)
    llm.generate(PROMPTS, SamplingParams(max_tokens=3, ignore_eos=True))
    llm.assert_all_free()
    prefills = [t for t in llm.trace if t.phase == "prefill"]
    return llm.trace, prefills, sum(sum(t.extend_lens) for t in prefills)


def _first_step(prefills, uid: int) -> int:
    return next(t.step for t in prefills if uid in t.uids)


def test_answer_1_two_hundred_pages():
    trace, prefills, fcfs = _run("fcfs", 200)
    assert (fcfs, len(trace)) == (768, 23)
    step1 = next(t for t in prefills if t.step == 1)
    assert (step1.uids, step1.cached_lens) == ([6], [48]), step1  # uid3 to uid5 passed over
    step8 = next(t for t in prefills if t.step == 8)
    assert {u: c for u, c in zip(step8.uids, step8.cached_lens) if u in (7, 8)} == {7: 0, 8: 0}, step8
    trace, prefills, lpm = _run("lpm", 200)
    assert (lpm, len(trace)) == (384, 20)
    step1 = next(t for t in prefills if t.step == 1)
    assert (step1.uids, step1.cached_lens) == ([6], [48]), step1
    starts = {g: min(_first_step(prefills, u) for u in range(len(PROMPTS)) if GROUP[u] == g) for g in (3, 4, 5)}
    assert set(starts.values()) == {10}, starts
    step11 = next(t for t in prefills if t.step == 11)
    assert any(GROUP[u] in (3, 4, 5) and c == 48 for u, c in zip(step11.uids, step11.cached_lens)), step11


def test_answer_3_without_the_in_batch_wait(monkeypatch: pytest.MonkeyPatch):
    from minisgl.scheduler import prefix

    monkeypatch.setattr(prefix, "SHARED_PREFIX_WAIT", 49)
    trace, prefills, computed = _run("lpm", 400)
    assert (computed, len(trace)) == (480, 18)
    assert {_first_step(prefills, u) for u in (10, 11)} == {12}
    assert {_first_step(prefills, u) for u in (16, 17, 22, 23)} == {15}


def test_answer_4_the_smallest_ratio_that_retracts_nothing():
    chat = gap.chat_requests(256, prompt=(100, 400), output=(20, 400), max_tokens=1024, seed=0)
    runs = {r: gap.simulate(chat, num_pages=20_000, max_running=256, ratio=r) for r in (1.0, 0.06, 0.05)}
    assert (runs[0.05].retractions, runs[0.06].retractions) == (2, 0)
    mean = {r: sum(res.decode_sizes) / len(res.decode_sizes) for r, res in runs.items()}
    assert (round(mean[0.06]), round(mean[1.0], 1)) == (40, 14.6), mean
