"""Chapter 20: a mixture-of-experts model generates what transformers generates."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import hf_greedy  # noqa: E402

from minisgl.core import SamplingParams
from minisgl.engine import EngineConfig
from minisgl.llm import LLM
from minisgl.scheduler import SchedulerConfig

path = "models/tiny-qwen3-moe"
llm = LLM(config=SchedulerConfig(engine=EngineConfig(model_path=path, max_running_reqs=2, max_seq_len=64, num_pages=128), overlap=False))
prompt = [3, 14, 15, 92, 65]
out = llm.generate([prompt], SamplingParams(max_tokens=4, ignore_eos=True))[0]
assert out.token_ids == hf_greedy(path, prompt, 4), out.token_ids
print(out.token_ids)
