from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from minisgl.engine.config import EngineConfig
from minisgl.env import ENV

from .prefill import SCHEDULE_POLICIES


def check_schedule_policy(schedule_policy: str, prefix_cache: str) -> None:
    """Raise ValueError unless the policy exists and the prefix cache can serve it."""
    if schedule_policy not in SCHEDULE_POLICIES:
        raise ValueError(f"schedule_policy must be one of {', '.join(SCHEDULE_POLICIES)}; got {schedule_policy!r}")
    if schedule_policy == "lpm" and prefix_cache != "radix":
        raise ValueError("schedule_policy 'lpm' orders requests by their prefix-cache hits and needs prefix_cache='radix'")


@dataclass(frozen=True)
class SchedulerConfig:
    engine: EngineConfig = field(default_factory=EngineConfig)
    prefix_cache: str = "radix"  # "radix" | "naive"
    # prefill token budget per step; longer prompts are chunked. None: suited to the device, so
    # that one long prompt never makes a step of many seconds (resolved in __post_init__)
    max_extend_tokens: Optional[int] = None
    schedule_policy: str = "fcfs"  # "fcfs" | "lpm": order waiting requests by arrival or by cached prefix
    overlap: bool = not ENV.disable_overlap  # plan step N+1 while step N runs
    check_integrity: bool = ENV.check_integrity  # check every table row and page after each step

    def __post_init__(self) -> None:
        if self.max_extend_tokens is None:
            object.__setattr__(self, "max_extend_tokens", default_extend_budget(self.engine.torch_device.type))
        if self.prefix_cache not in ("radix", "naive"):
            raise ValueError(f"prefix_cache must be 'radix' or 'naive', got {self.prefix_cache!r}")
        check_schedule_policy(self.schedule_policy, self.prefix_cache)
        if self.max_extend_tokens < 1:
            raise ValueError(f"max_extend_tokens must be >= 1, got {self.max_extend_tokens}")


def default_extend_budget(device_type: str) -> int:
    """Prefill tokens per step by default: 8192 on a GPU (a step stays well under a second for
    the models here), 256 on the CPU (where a token of prefill costs milliseconds, not microseconds)."""
    return 8192 if device_type == "cuda" else 256
