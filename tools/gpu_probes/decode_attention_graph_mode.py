"""FlashInfer's CUDA-core decode in CUDA-graph mode (split-KV forced below a grid size) against eager."""
import torch, flashinfer
from _timing import graph_us
dev = torch.device("cuda"); dt = torch.bfloat16
HQ, HKV, D = 16, 8, 128
n = 900
SLOTS = 260 * n + 64
k = torch.randn(SLOTS, 1, HKV, D, dtype=dt, device=dev); v = torch.randn_like(k)
ws = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
for bs in (64, 96, 120, 128, 131, 132, 136, 144, 160, 192, 224, 256):
    q = torch.randn(bs, HQ, D, dtype=dt, device=dev)
    indptr = torch.arange(0, bs * n + 1, n, dtype=torch.int32)
    idx = torch.arange(bs * n, dtype=torch.int32, device=dev)
    last = torch.ones(bs, dtype=torch.int32)
    e = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    e.plan(indptr, idx, last, HQ, HKV, D, 1, q_data_type=dt, kv_data_type=dt)
    t_e = graph_us(lambda: e.run(q, (k, v)))
    ws2 = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    b_ind = torch.zeros(bs + 1, dtype=torch.int32, device=dev); b_idx = torch.zeros(SLOTS, dtype=torch.int32, device=dev); b_last = torch.ones(bs, dtype=torch.int32, device=dev)
    g = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws2, "NHD", use_cuda_graph=True, paged_kv_indptr_buffer=b_ind, paged_kv_indices_buffer=b_idx, paged_kv_last_page_len_buffer=b_last)
    g.plan(indptr, idx, last, HQ, HKV, D, 1, q_data_type=dt, kv_data_type=dt)
    t_g = graph_us(lambda: g.run(q, (k, v)))
    split = getattr(g, "_plan_info", None)
    nbytes = bs * n * HKV * D * 4
    print(f"bs {bs:4d} x {n}: eager {t_e:7.1f} us ({nbytes/t_e/1e6:.2f} TB/s)  graph-mode {t_g:7.1f} us ({nbytes/t_g/1e6:.2f} TB/s)  ratio {t_g/t_e:.3f}", flush=True)
    del ws2
