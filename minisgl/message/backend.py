"""Messages the scheduler receives (from the tokenizer worker)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minisgl.core import SamplingParams

from .serde import message

message(SamplingParams)  # travels inside UserMsg


@message
@dataclass
class UserMsg:
    """A tokenized request, ready to be scheduled."""

    uid: int
    input_ids: torch.Tensor  # [prompt_len] int32
    sampling_params: SamplingParams


@message
@dataclass
class AbortMsg:
    """Stop a request and free its resources (client gone, or a stop string was seen)."""

    uid: int


@message
@dataclass
class StatusQuery:
    """Ask the scheduler how many rows and pages are free (answered by a `StatusMsg`)."""

    uid: int


@message
@dataclass
class ExitMsg:
    """Leave the main loop; the process then exits."""
