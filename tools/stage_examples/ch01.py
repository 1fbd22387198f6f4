"""Chapter 1: a request's ledger moves through prefill and two decode steps."""

import torch

from minisgl.core import Batch, Req, SamplingParams

req = Req(torch.tensor([1, 2, 3, 4], dtype=torch.int32), table_idx=0, cached_len=0, uid=0,
          sampling_params=SamplingParams(max_tokens=3), cache_handle=None)
assert (req.cached_len, req.device_len, req.max_device_len, req.extend_len) == (0, 4, 7, 4)
batch = Batch([req], "prefill")
assert batch.num_tokens == 4
for token in (10, 11):
    req.complete_one()
    req.append_host(token)
assert (req.cached_len, req.device_len, req.remain_len) == (5, 6, 1)
assert req.output_ids.tolist() == [10, 11]
print(req)
