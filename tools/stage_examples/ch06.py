"""Chapter 6: one prefill through the Engine gives transformers' next token."""

import torch
from transformers import AutoModelForCausalLM

from minisgl.core import Batch, Req, SamplingParams
from minisgl.engine import Engine, EngineConfig

path = "models/tiny-llama"
engine = Engine(EngineConfig(model_path=path, max_running_reqs=2, max_seq_len=64, num_pages=64))
ids = torch.tensor([5, 17, 42, 8, 99], dtype=torch.int32)
req = Req(ids, table_idx=0, cached_len=0, uid=0, sampling_params=SamplingParams(max_tokens=2), cache_handle=None)
engine.page_table[0, : len(ids)] = torch.arange(len(ids), dtype=torch.int32)
batch = Batch([req], "prefill", input_ids=ids, positions=torch.arange(len(ids)),
              out_loc=torch.arange(len(ids)), last_indices=torch.tensor([len(ids) - 1]))
token = int(engine.forward_batch(batch, None).tokens[0])
hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
ref = int(hf(ids[None].long()).logits[0, -1].argmax())
assert token == ref, (token, ref)
assert (req.cached_len, req.device_len) == (5, 6)
print("next token", token)
