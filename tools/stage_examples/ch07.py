"""Chapter 7: the offline LLM generates for several requests of different lengths."""

import sys
from dataclasses import fields
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import hf_greedy  # noqa: E402

from minisgl.core import SamplingParams
from minisgl.llm import LLM
from minisgl.scheduler import SchedulerConfig
from minisgl.engine import EngineConfig

path = "models/tiny-llama"
cfg = SchedulerConfig(engine=EngineConfig(model_path=path, max_running_reqs=4, max_seq_len=128, num_pages=256))
# chapter 7's settings alone: a prefix cache, overlap, a policy's bound arrive with their modules
assert [f.name for f in fields(SchedulerConfig)] == ["engine", "max_extend_tokens", "schedule_policy", "offline",
                                                     "check_integrity"], fields(SchedulerConfig)
llm = LLM(config=cfg)
# in this stage the offline LLM is chapter 7's scheduler alone: no later idea is stacked on it
assert [c.__name__ for c in LLM.__mro__] == ["LLM", "Scheduler", "object"], LLM.__mro__
prompts = [[1, 5, 9, 13], [2, 4], [7, 7, 7, 7, 7, 7]]
lengths = [5, 2, 4]
outs = llm.generate(prompts, [SamplingParams(max_tokens=n, ignore_eos=True) for n in lengths])
for p, n, o in zip(prompts, lengths, outs):
    assert o.token_ids == hf_greedy(path, p, n), (p, o.token_ids)
llm.assert_all_free()
print([o.token_ids for o in outs])

# whole prompts: a prompt longer than the prefill budget is still computed in one step
whole = LLM(config=SchedulerConfig(engine=cfg.engine, max_extend_tokens=8))
long_prompt = [(7 * i) % 200 + 1 for i in range(30)]
out = whole.generate([long_prompt], SamplingParams(max_tokens=3, ignore_eos=True))[0]
assert [t.extend_lens for t in whole.trace if t.phase == "prefill"] == [[30]], whole.trace
assert out.token_ids == hf_greedy(path, long_prompt, 3)
whole.assert_all_free()
