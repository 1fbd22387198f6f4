"""Table rows: each running request owns one row of the page table and of the token pool."""

from __future__ import annotations

from typing import List

import torch


class TableManager:
    def __init__(self, max_running_reqs: int, page_table: torch.Tensor):
        self.max_running_reqs = max_running_reqs
        self._free_rows: List[int] = list(reversed(range(max_running_reqs)))
        self.page_table = page_table  # [rows + 1 dummy, max_seq_len] slot of each position
        # token ids by position, on the device: the sampler writes here, the next step reads here,
        # so a decode step never waits for the host to learn the previous token
        self.token_pool = torch.zeros_like(page_table)

    @property
    def available_size(self) -> int:
        return len(self._free_rows)

    def allocate(self) -> int:
        return self._free_rows.pop()

    def free(self, row: int) -> None:
        assert 0 <= row < self.max_running_reqs and row not in self._free_rows, f"row {row} freed twice"
        self._free_rows.append(row)

    def check_integrity(self, used_rows: List[int]) -> None:
        rows = sorted(self._free_rows + used_rows)
        assert rows == list(range(self.max_running_reqs)), f"table rows leaked or doubled: {len(rows)} of {self.max_running_reqs}"
