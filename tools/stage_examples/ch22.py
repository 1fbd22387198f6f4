"""Chapter 22: longest-prefix-match scheduling admits the cached group first, same tokens."""

from minisgl.core import SamplingParams
from minisgl.engine import EngineConfig
from minisgl.llm import LLM
from minisgl.scheduler import SchedulerConfig

shared = list(range(10, 40))
prompts = [[5, 6, 7, 8], shared + [1], [9, 9, 9], shared + [2]]
sp = SamplingParams(max_tokens=3, ignore_eos=True)
tokens, first_batch = {}, {}
for policy in ("fcfs", "lpm"):
    cfg = SchedulerConfig(engine=EngineConfig(model_path="models/tiny-llama", max_running_reqs=2, max_seq_len=128, num_pages=256),
                          schedule_policy=policy, overlap=False)
    llm = LLM(config=cfg)
    llm.generate([shared + [3]], sp)  # leaves the shared prefix in the cache
    start = len(llm.trace)
    tokens[policy] = [o.token_ids for o in llm.generate(prompts, sp)]
    first_batch[policy] = llm.trace[start].uids
    llm.assert_all_free()
assert tokens["fcfs"] == tokens["lpm"], tokens
assert first_batch["fcfs"] == [1, 2] and first_batch["lpm"] == [2, 4], first_batch  # uids: 0 was the warm-up
print("first prefill batch: fcfs", first_batch["fcfs"], "lpm", first_batch["lpm"])
