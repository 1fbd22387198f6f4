from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

from minisgl.engine import EngineConfig
from minisgl.env import ENV

from .prefill import SCHEDULE_POLICIES, SchedulePolicy, schedule_policy_class


class PolicyFlagMetadata(Mapping[str, Any]):
    """`schedule_policy`'s choices and help, read from `SCHEDULE_POLICIES` whenever they are asked
    for (a command line is built), not once: the modules of later chapters that register a policy
    import this one first, to add their settings to the config (`extends_config`)."""

    def __getitem__(self, key: str) -> Any:
        if key == "choices":
            return tuple(SCHEDULE_POLICIES)
        if key == "help":
            return ("the order waiting requests are offered to admission: "
                    + "; ".join(policy.summary for policy in SCHEDULE_POLICIES.values()))
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(("choices", "help"))

    def __len__(self) -> int:
        return 2


@dataclass(frozen=True)
class SchedulerConfig:
    """what runs when: batching, admission, and the settings of each scheduler extension

    The settings every scheduler has. A later module that brings an idea with settings of its own
    adds them (`minisgl.utils.settings.extends_config`); `minisgl.scheduler.SchedulerConfig`, which
    the front ends build, is this class with every such part (and this first line titles them all
    in `--help`)."""

    engine: EngineConfig = field(default_factory=EngineConfig)
    # None is resolved in __post_init__, to a budget suited to the device, so that one long
    # prompt never makes a step of many seconds
    max_extend_tokens: Optional[int] = field(default=None, metadata={
        "help": "prefill token budget per step; default: on a GPU 8192 for a server, "
                "16384 offline; on the CPU 256 for a server, 4096 offline"})
    schedule_policy: str = field(default="fcfs", metadata=PolicyFlagMetadata())
    # set by the offline `LLM` front end, which is judged by its total time, not by its streams
    offline: bool = field(default=False, metadata={"cli": False, "help": "no user watches a stream: prefill in fewer, "
                                                                         "fuller steps"})
    check_integrity: bool = field(default_factory=lambda: ENV.check_integrity, metadata={
        "help": "check every table row and KV page after each step (slow); default: off, unless "
                "MINISGL_CHECK_INTEGRITY=1"})

    def __post_init__(self) -> None:
        if self.max_extend_tokens is None:
            budget = default_extend_budget(self.engine.torch_device.type, self.offline)
            object.__setattr__(self, "max_extend_tokens", budget)
        if self.max_extend_tokens < 1:
            raise ValueError(f"max_extend_tokens must be >= 1, got {self.max_extend_tokens}")
        # a registered policy, and the settings it needs are there
        schedule_policy_class(self.schedule_policy).check_config(self)

    def new_schedule_policy(self) -> SchedulePolicy:
        """A fresh object of the configured policy (each prefill manager owns one: it may keep state)."""
        return SCHEDULE_POLICIES[self.schedule_policy].from_config(self)


def default_extend_budget(device_type: str, offline: bool = False) -> int:
    """Prefill tokens per step by default. A server keeps steps short, so streams are never stalled
    for long: 8192 on a GPU, 256 on the CPU, where a token of prefill costs milliseconds. The offline
    `LLM` has no streams to keep moving and takes fuller steps (16384 on a GPU, 4096 on the CPU):
    a step's fixed cost (launching every layer's kernels on a GPU, reading every weight on the CPU)
    is then paid fewer times."""
    if device_type == "cuda":
        return 16384 if offline else 8192
    return 4096 if offline else 256
