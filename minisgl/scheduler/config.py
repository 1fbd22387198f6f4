from __future__ import annotations

from dataclasses import dataclass, field

from minisgl.engine.config import EngineConfig
from minisgl.env import ENV


@dataclass(frozen=True)
class SchedulerConfig:
    engine: EngineConfig = field(default_factory=EngineConfig)
    prefix_cache: str = "radix"  # "radix" | "naive"
    max_extend_tokens: int = 8192  # prefill token budget per step; longer prompts are chunked
    overlap: bool = not ENV.disable_overlap  # plan step N+1 while step N runs
    check_integrity: bool = ENV.check_integrity  # check every table row and page after each step

    def __post_init__(self) -> None:
        if self.prefix_cache not in ("radix", "naive"):
            raise ValueError(f"prefix_cache must be 'radix' or 'naive', got {self.prefix_cache!r}")
        if self.max_extend_tokens < 1:
            raise ValueError(f"max_extend_tokens must be >= 1, got {self.max_extend_tokens}")
