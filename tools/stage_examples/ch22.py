"""Chapter 22: longest-prefix-match scheduling admits the cached group first, same tokens; lpm-aged with
a bound of 0 is arrival order, and with a bound never reached is lpm."""

from minisgl.core import SamplingParams
from minisgl.engine import EngineConfig
from minisgl.llm import LLM
from minisgl.scheduler import SchedulerConfig

shared = list(range(10, 40))
prompts = [[5, 6, 7, 8], shared + [1], [9, 9, 9], shared + [2]]
sp = SamplingParams(max_tokens=3, ignore_eos=True)
tokens, first_batch = {}, {}
runs = {"fcfs": ("fcfs", None), "lpm": ("lpm", None), "aged 0": ("lpm-aged", 0), "aged 99": ("lpm-aged", 99)}
for policy, (name, bound) in runs.items():
    cfg = SchedulerConfig(engine=EngineConfig(model_path="models/tiny-llama", max_running_reqs=2, max_seq_len=128, num_pages=256),
                          schedule_policy=name, lpm_max_wait=bound, overlap=False)
    llm = LLM(config=cfg)
    llm.generate([shared + [3]], sp)  # leaves the shared prefix in the cache
    start = len(llm.trace)
    tokens[policy] = [o.token_ids for o in llm.generate(prompts, sp)]
    first_batch[policy] = llm.trace[start].uids
    llm.assert_all_free()
assert tokens["fcfs"] == tokens["lpm"] == tokens["aged 0"] == tokens["aged 99"], tokens
assert first_batch["fcfs"] == [1, 2] and first_batch["lpm"] == [2, 4], first_batch  # uids: 0 was the warm-up
assert first_batch["aged 0"] == first_batch["fcfs"] and first_batch["aged 99"] == first_batch["lpm"], first_batch
print("first prefill batch: fcfs", first_batch["fcfs"], "lpm", first_batch["lpm"])
