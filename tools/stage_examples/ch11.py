"""Chapter 11: overlap scheduling gives the same tokens as the plain loop."""

from minisgl.core import SamplingParams
from minisgl.engine import EngineConfig
from minisgl.llm import LLM
from minisgl.scheduler import SchedulerConfig


def run(overlap: bool):
    cfg = SchedulerConfig(engine=EngineConfig(model_path="models/tiny-llama", max_running_reqs=4, max_seq_len=128,
                                              num_pages=256), prefix_cache="radix", overlap=overlap)
    llm = LLM(config=cfg)
    outs = llm.generate([[1, 2, 3], [9, 8, 7, 6], [5]], [SamplingParams(max_tokens=n, ignore_eos=True) for n in (6, 3, 5)])
    llm.assert_all_free()
    return [o.token_ids for o in outs]


plain, overlapped = run(False), run(True)
assert plain == overlapped, (plain, overlapped)
print(overlapped)
