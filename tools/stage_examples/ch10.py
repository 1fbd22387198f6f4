"""Chapter 10: the chunked-prefill mixin cuts a prompt longer than the prefill budget into chunks,
where chapter 7's scheduler computes it whole; the tokens are the same."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import hf_greedy  # noqa: E402

from minisgl.core import SamplingParams
from minisgl.engine import EngineConfig
from minisgl.llm import LLM
from minisgl.scheduler import ChunkedPrefillMixin, SchedulerConfig, scheduler_extensions

assert scheduler_extensions() == ["prefix_cache", "chunked_prefill"], scheduler_extensions()
assert ChunkedPrefillMixin in LLM.__mro__
path = "models/tiny-llama"
cfg = SchedulerConfig(engine=EngineConfig(model_path=path, max_running_reqs=4, max_seq_len=128, num_pages=256),
                      prefix_cache="naive", max_extend_tokens=8)
llm = LLM(config=cfg)
prompt = [(7 * i) % 200 + 1 for i in range(30)]
out = llm.generate([prompt], SamplingParams(max_tokens=3, ignore_eos=True))[0]
chunks = [t.extend_lens for t in llm.trace if t.phase == "prefill"]
assert chunks == [[8], [8], [8], [6]], chunks
assert out.token_ids == hf_greedy(path, prompt, 3)
llm.assert_all_free()
print("prefill steps", len(chunks))
