"""Chapter 10's answer to question 1 of its questions gives a schedule no cell prints: it is
checked here, on section 3's own run (SmolLM2's tokenizer and the same four prompts, `max_tokens=6`)
with the budget set to 5.

Claims: uid0 takes step 0 whole; uid1's 45 tokens take 9 chunks of 5, in steps 1, 3, 5, 7 and 9
(uid0 decoding in the steps between) and then 11 to 14; uid2 is cut, 5 tokens in step 15 and its
last 1 beside 4 of uid3's in step 17.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "chapters"))

LONG = ("Here is a list of the planets of the solar system in order from the sun, with one fact about each "
        "planet and its moons, written for a class of ten year old children: Mercury is the smallest planet and it is")
PROMPTS = ["The capital of France is", LONG, "def fibonacci(n):", "1 + 1 ="]


def test_answer_1_a_budget_of_5():
    import figures
    from transformers import AutoTokenizer

    from minisgl.core import SamplingParams
    from minisgl.engine import EngineConfig
    from minisgl.scheduler import SchedulerConfig, scheduler_bases

    class ChunkedScheduler(*scheduler_bases()):
        """Chapter 7's scheduler with every mixin registered (as section 3 builds it)."""

    model = REPO / "models" / "smollm2-135m-instruct"
    tok = AutoTokenizer.from_pretrained(model)
    ids = [tok.encode(p) for p in PROMPTS]
    assert [len(i) for i in ids] == [5, 45, 6, 5]
    engine = EngineConfig(model_path=str(model), max_running_reqs=8, max_seq_len=512)
    sched = ChunkedScheduler(SchedulerConfig(engine=engine, prefix_cache="naive", max_extend_tokens=5))
    figures.drive(sched, {0: [(i, SamplingParams(max_tokens=6, ignore_eos=True)) for i in ids]})
    prefills = {t.step: dict(zip(t.uids, t.extend_lens)) for t in sched.trace if t.phase == "prefill"}
    assert prefills[0] == {0: 5}
    uid1 = [step for step, b in sorted(prefills.items()) if 1 in b]
    assert uid1 == [1, 3, 5, 7, 9, 11, 12, 13, 14] and all(prefills[s][1] == 5 for s in uid1)
    assert prefills[15] == {2: 5} and prefills[17] == {2: 1, 3: 4}
