"""Chapter 8: with the naive cache every page comes back after generate."""

from minisgl.core import SamplingParams
from minisgl.engine import EngineConfig
from minisgl.llm import LLM
from minisgl.scheduler import SchedulerConfig

cfg = SchedulerConfig(engine=EngineConfig(model_path="models/tiny-llama", max_running_reqs=4, max_seq_len=128,
                                          num_pages=64, page_size=4), prefix_cache="naive")
llm = LLM(config=cfg)
outs = llm.generate([[3] * 10, [4] * 7], SamplingParams(max_tokens=6, ignore_eos=True))
assert [len(o.token_ids) for o in outs] == [6, 6]
llm.assert_all_free()
assert llm.cache.free_pages == llm.cache.num_pages
print("free pages", llm.cache.free_pages)
