"""Logits processors: what changes a batch's logits before the draw, each row by its own settings.

In order (transformers' order, which vLLM's follows too: the bias before the penalties):

1. `logit_bias`, added per (row, token);
2. the repetition penalty (transformers' rule) over the prompt and the output so far, then the
   frequency and presence penalties (OpenAI's rule) over the output;
3. masks: end-of-sequence and stop tokens while a row has fewer than `min_tokens` outputs, and
   a bitmask of allowed tokens, for the rows that have one;
4. min_p, after temperature: drop tokens less likely than `min_p` times the most likely one
   (vLLM's place for it: before top-k and top-p, which `Sampler.sample` applies).

A row's token history is not kept anywhere new: it is read from the token pool on the device
(the prompt and every token sampled so far already live there), turned into per-token counts
with one scatter for the whole batch. Sparse settings (biases, masked ids) travel as flat
(row, token) index lists, so a batch costs the same few kernels whatever its mix of settings.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Iterable, List, Optional, Tuple

import torch

from minisgl.core import Req


@dataclass
class PenaltyArgs:
    """Device tensors for the history-based penalties, one entry per row."""

    history: torch.Tensor  # the token pool: [rows, max_seq_len] token ids by position
    rows: torch.Tensor  # [bs] int64: each request's row in the pool
    prompt_lens: torch.Tensor  # [bs] int64
    lens: torch.Tensor  # [bs] int64: tokens known so far (the position being sampled)
    max_len: int  # max(lens), on the host
    repetition: torch.Tensor  # [bs] float32, 1: off
    frequency: torch.Tensor  # [bs] float32, 0: off
    presence: torch.Tensor  # [bs] float32, 0: off
    use_repetition: bool
    use_frequency_presence: bool


@dataclass
class LogitsArgs:
    """Everything a batch's logits go through before the draw; a `None` part is skipped."""

    penalties: Optional[PenaltyArgs] = None
    bias_index: Optional[Tuple[torch.Tensor, torch.Tensor]] = None  # (rows, token ids), int64
    bias_values: Optional[torch.Tensor] = None  # float32, one per index pair
    banned_index: Optional[Tuple[torch.Tensor, torch.Tensor]] = None  # (rows, token ids) set to -inf
    bitmask: Optional[torch.Tensor] = None  # [bs, ceil(vocab / 32)] int32, bit j of word w: token 32w + j allowed
    min_p: Optional[torch.Tensor] = None  # [bs] float32, 0: off


def _index(pairs: List[Tuple[int, int]], device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
    t = torch.tensor(pairs, dtype=torch.int64).reshape(-1, 2).to(device, non_blocking=True)
    return t[:, 0], t[:, 1]


def make_logits_args(
    reqs: List[Req], device: torch.device, history: torch.Tensor, eos_ids: Iterable[int],
    bitmask: Optional[torch.Tensor] = None
) -> Optional[LogitsArgs]:
    """The processors a batch needs (None: none). Call before the forward pass (the lengths are
    read before `complete_one` moves them); `bitmask`: allowed tokens per row, on the host."""
    params = [r.sampling_params for r in reqs]
    args = LogitsArgs()
    if any(sp.uses_penalties for sp in params):
        lens = [r.device_len for r in reqs]
        f32 = lambda xs: torch.tensor(xs, dtype=torch.float32).to(device, non_blocking=True)  # noqa: E731
        i64 = lambda xs: torch.tensor(xs, dtype=torch.int64).to(device, non_blocking=True)  # noqa: E731
        args.penalties = PenaltyArgs(
            history=history,
            rows=i64([r.table_idx for r in reqs]),
            prompt_lens=i64([r.prompt_len for r in reqs]),
            lens=i64(lens),
            max_len=max(lens),
            repetition=f32([sp.repetition_penalty for sp in params]),
            frequency=f32([sp.frequency_penalty for sp in params]),
            presence=f32([sp.presence_penalty for sp in params]),
            use_repetition=any(sp.repetition_penalty != 1 for sp in params),
            use_frequency_presence=any(sp.frequency_penalty != 0 or sp.presence_penalty != 0 for sp in params),
        )
    bias = [(i, t, b) for i, sp in enumerate(params) for t, b in sp.logit_bias]
    if bias:
        args.bias_index = _index([(i, t) for i, t, _ in bias], device)
        args.bias_values = torch.tensor([b for _, _, b in bias], dtype=torch.float32).to(device, non_blocking=True)
    eos = tuple(eos_ids)
    # rows still short of min_tokens: their next token may not end the output
    banned = [(i, t) for i, (r, sp) in enumerate(zip(reqs, params)) if r.device_len - r.prompt_len < sp.min_tokens
              for t in dict.fromkeys((() if sp.ignore_eos else eos) + sp.stop_token_ids)]
    if banned:
        args.banned_index = _index(banned, device)
    if bitmask is not None:
        args.bitmask = bitmask.to(device, non_blocking=True)
    if any(sp.min_p > 0 for sp in params):
        args.min_p = torch.tensor([sp.min_p for sp in params], dtype=torch.float32).to(device, non_blocking=True)
    return None if all(getattr(args, f.name) is None for f in fields(args)) else args


def token_counts(p: PenaltyArgs, vocab_size: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """`[bs, vocab]` float32 counts of each token in (prompt + output so far, output so far)."""
    pos = torch.arange(p.max_len, device=p.rows.device)
    ids = p.history[p.rows[:, None], pos[None, :]].long()  # [bs, max_len]; past a row's length: stale ids, masked
    known = pos[None, :] < p.lens[:, None]
    output = known & (pos[None, :] >= p.prompt_lens[:, None])
    zeros = torch.zeros(len(ids), vocab_size, dtype=torch.float32, device=ids.device)
    return zeros.scatter_add(1, ids, known.float()), zeros.scatter_add(1, ids, output.float())


def apply_penalties(logits: torch.Tensor, p: PenaltyArgs) -> torch.Tensor:
    seen, counts = token_counts(p, logits.shape[-1])
    if p.use_repetition:
        rep = p.repetition[:, None]
        logits = torch.where(seen > 0, torch.where(logits < 0, logits * rep, logits / rep), logits)
    if p.use_frequency_presence:
        logits = logits - p.frequency[:, None] * counts
        logits = logits - p.presence[:, None] * (counts > 0).float()
    return logits


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """-inf where the bitmask's bit is clear. bitmask: `[bs, ceil(vocab / 32)]` int32."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    allowed = ((bitmask[:, :, None] >> shifts) & 1).flatten(1)[:, : logits.shape[-1]].bool()  # [bs, vocab]
    return logits.masked_fill(~allowed, float("-inf"))


def process_logits(logits: torch.Tensor, args: LogitsArgs) -> torch.Tensor:
    """Steps 1-3 of the module docstring; returns new float32 logits (the input is left alone)."""
    logits = logits.float()
    if args.bias_index is not None:
        logits = logits.index_put(args.bias_index, args.bias_values, accumulate=True)
    if args.penalties is not None:
        logits = apply_penalties(logits, args.penalties)
    if args.banned_index is not None:
        logits = logits.index_put(args.banned_index, torch.tensor(float("-inf"), device=logits.device))
    if args.bitmask is not None:
        logits = apply_token_bitmask(logits, args.bitmask)
    return logits


def apply_min_p(logits: torch.Tensor, temperatures: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Step 4: -inf where softmax(logits / T) < min_p * its maximum. Greedy rows (T = 0) keep
    their argmax whatever happens to the rest, and min_p = 0 rows lose nothing."""
    probs = torch.softmax(logits / temperatures.clamp_min(1e-6)[:, None], dim=-1)
    drop = probs < min_p[:, None] * probs.amax(dim=-1, keepdim=True)
    return logits.masked_fill(drop, float("-inf"))
