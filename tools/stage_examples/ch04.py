"""Chapter 4: KV written through the page table lands in the slots the row names."""

import torch

from minisgl.kvcache.mha_pool import MHAKVCache
from minisgl.scheduler.table import TableManager

pool = MHAKVCache(num_layers=2, num_pages=16, page_size=1, num_kv_heads=2, head_dim=4,
                  dtype=torch.float32, device=torch.device("cpu"))
page_table = torch.zeros(4 + 1, 32, dtype=torch.int32)
table = TableManager(4, page_table)
row = table.allocate()
page_table[row, :3] = torch.tensor([7, 2, 11])
k = torch.randn(3, 2, 4)
pool.store_kv(k, -k, page_table[row, :3].long(), layer=1)
assert torch.equal(pool.k_cache(1)[[7, 2, 11]], k)
table.free(row)
table.check_integrity([])
print("slots", page_table[row, :3].tolist())
