"""Chapter 11: the overlap mixin reads step N after launching step N+1, and gives the same tokens
as the loop that reads each step at once."""

from minisgl.core import SamplingParams
from minisgl.engine import EngineConfig
from minisgl.llm import LLM
from minisgl.scheduler import OverlapMixin, SchedulerConfig, scheduler_extensions

assert scheduler_extensions() == ["prefix_cache", "chunked_prefill", "overlap"], scheduler_extensions()
assert OverlapMixin in LLM.__mro__


def run(overlap: bool):
    cfg = SchedulerConfig(engine=EngineConfig(model_path="models/tiny-llama", max_running_reqs=4, max_seq_len=128,
                                              num_pages=256), prefix_cache="radix", overlap=overlap)
    llm = LLM(config=cfg)
    unread = []  # launched batches not read yet, seen at each read
    process = llm.process_results
    llm.process_results = lambda result: (unread.append(len(llm.unprocessed)), process(result))
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (6, 3, 5)]
    outs = llm.generate([[1, 2, 3], [9, 8, 7, 6], [5]], params)
    llm.assert_all_free()
    # with overlap, every read but the last finds the next step already launched
    assert max(unread) == (2 if overlap else 1) and unread[-1] == 1, unread
    return [o.token_ids for o in outs]


plain, overlapped = run(False), run(True)
assert plain == overlapped, (plain, overlapped)
print(overlapped)
