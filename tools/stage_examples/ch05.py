"""Chapter 5: the torch backend over a scattered page table equals SDPA on contiguous tensors."""

import torch
import torch.nn.functional as F

from minisgl.attention.torch_backend import TorchAttnBackend
from minisgl.core import Batch, Req, SamplingParams
from minisgl.kvcache.mha_pool import MHAKVCache

torch.manual_seed(0)
n, heads, kv_heads, dim = 5, 4, 2, 8
pool = MHAKVCache(1, 32, 1, kv_heads, dim, torch.float32, torch.device("cpu"))
page_table = torch.zeros(2, 16, dtype=torch.int32)
page_table[0, :n] = torch.tensor([9, 3, 20, 1, 14])
backend = TorchAttnBackend(pool, page_table, pad_slot=31)
req = Req(torch.arange(n, dtype=torch.int32), 0, 0, 0, SamplingParams(max_tokens=1), None)
batch = Batch([req], "prefill", out_loc=page_table[0, :n].long())
backend.prepare_metadata(batch)
q, k, v = torch.randn(n, heads, dim), torch.randn(n, kv_heads, dim), torch.randn(n, kv_heads, dim)
out = backend.attend(q, k, v, 0, batch)
ref = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True, enable_gqa=True)
assert torch.allclose(out, ref.transpose(0, 1), atol=1e-6)
print("max abs diff", float((out - ref.transpose(0, 1)).abs().max()))
