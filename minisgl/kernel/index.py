"""Page indices for FlashInfer, gathered on the device from the page table.

The page table holds a slot id for every position of a request. FlashInfer wants, per request,
the list of its pages: the slot of each page's first position divided by the page size, laid
end to end (CSR form, with `kv_indptr` giving where each request's list starts).
"""

from __future__ import annotations

import torch

from .util import use_triton

try:
    import triton
    import triton.language as tl

    @triton.jit(do_not_specialize=["page_size"])
    def _gather_pages_kernel(page_table_ptr, rows_ptr, indptr_ptr, out_ptr, table_stride, page_size,
                             BLOCK: tl.constexpr):
        # program (i, b): pages [b * BLOCK, (b + 1) * BLOCK) of request i
        i = tl.program_id(0)
        row = tl.load(rows_ptr + i).to(tl.int64)
        start = tl.load(indptr_ptr + i)
        n = tl.load(indptr_ptr + i + 1) - start
        j = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = j < n
        slot = tl.load(page_table_ptr + row * table_stride + j.to(tl.int64) * page_size, mask=mask)
        tl.store(out_ptr + start + j, slot // page_size, mask=mask)

except ImportError:  # pragma: no cover
    triton = None


def gather_page_indices_ref(page_table: torch.Tensor, rows: torch.Tensor, kv_indptr: torch.Tensor, page_size: int,
                            total: int) -> torch.Tensor:
    """rows: `[bs]` table rows; kv_indptr: `[bs + 1]` int32 page offsets; returns `[total]` int32."""
    counts = (kv_indptr[1:] - kv_indptr[:-1]).long()
    # for page k of the flat list: which request owns it, and its number within that request
    owner = torch.repeat_interleave(torch.arange(len(counts), device=rows.device), counts, output_size=total)
    within = torch.arange(total, device=rows.device) - kv_indptr[:-1].long()[owner]
    slots = page_table[rows.long()[owner], within * page_size]
    return (slots // page_size).to(torch.int32)


def gather_page_indices(
    page_table: torch.Tensor, rows: torch.Tensor, kv_indptr: torch.Tensor, page_size: int, total: int, max_pages: int,
    out: torch.Tensor | None = None
) -> torch.Tensor:
    """Page list of every request in `rows`, concatenated. `total` (= `kv_indptr[-1]`) and
    `max_pages` (the longest request's page count) come from the host, so nothing syncs."""
    if out is None:
        out = torch.empty(total, dtype=torch.int32, device=page_table.device)
    if total == 0:
        return out
    if not use_triton(page_table):
        out[:total] = gather_page_indices_ref(page_table, rows, kv_indptr, page_size, total)
        return out
    assert page_table.stride(1) == 1
    block = 256
    grid = (len(rows), triton.cdiv(max_pages, block))
    _gather_pages_kernel[grid](page_table, rows, kv_indptr, out, page_table.stride(0), page_size, BLOCK=block)
    return out
