"""Chapter 9: the radix cache reuses a shared prefix, and the tokens do not change."""

from minisgl.core import SamplingParams
from minisgl.engine import EngineConfig
from minisgl.llm import LLM
from minisgl.scheduler import SchedulerConfig

cfg = SchedulerConfig(engine=EngineConfig(model_path="models/tiny-llama", max_running_reqs=4, max_seq_len=128,
                                          num_pages=256), prefix_cache="radix")
llm = LLM(config=cfg)
prefix = list(range(10, 30))
sp = SamplingParams(max_tokens=4, ignore_eos=True)
first = llm.generate([prefix + [1]], sp)[0]
second = llm.generate([prefix + [1]], sp)[0]
assert second.cached_tokens >= len(prefix), second.cached_tokens
assert first.token_ids == second.token_ids
llm.assert_all_free()
print("cached tokens", second.cached_tokens)
