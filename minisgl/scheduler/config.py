from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Tuple

from minisgl.engine import EngineConfig
from minisgl.env import ENV

from .prefill import SCHEDULE_POLICIES, SchedulePolicy, schedule_policy_class

try:
    from minisgl.kvcache import PREFIX_CACHES
except ImportError:  # a package without prefix caches: its scheduler keeps nothing, as the naive cache does
    PREFIX_CACHES = {}


def prefix_cache_names() -> Tuple[str, ...]:
    """The names `prefix_cache` accepts: the registered caches ("naive" alone where there are none)."""
    return tuple(sorted(PREFIX_CACHES)) or ("naive",)


def check_schedule_policy(schedule_policy: str, prefix_cache: str) -> None:
    """Raise ValueError unless the policy exists and the prefix cache can serve it."""
    keeps = getattr(PREFIX_CACHES.get(prefix_cache), "keeps_prefixes", False)
    if schedule_policy_class(schedule_policy).orders_by_prefix and not keeps:
        raise ValueError(f"schedule_policy {schedule_policy!r} orders requests by their prefix-cache hits and needs a "
                         f"prefix cache that keeps prefixes (prefix_cache='radix'); got {prefix_cache!r}")


def default_prefix_cache() -> str:
    """The radix cache where the package has it, else the naive one."""
    return "radix" if "radix" in PREFIX_CACHES else "naive"


@dataclass(frozen=True)
class SchedulerConfig:
    """what runs when: batching, prefix reuse, the prefill budget, overlap"""

    engine: EngineConfig = field(default_factory=EngineConfig)
    prefix_cache: str = field(default_factory=default_prefix_cache, metadata={
        "choices": prefix_cache_names(), "aliases": ("cache_type",),
        "help": "the prefix cache by name: radix reuses shared prompt prefixes; naive reuses nothing"})
    # None is resolved in __post_init__, to a budget suited to the device, so that one long
    # prompt never makes a step of many seconds
    max_extend_tokens: Optional[int] = field(default=None, metadata={
        "help": "prefill token budget per step; default: on a GPU 8192 for a server, "
                "16384 offline; on the CPU 256 for a server, 4096 offline"})
    schedule_policy: str = field(default="fcfs", metadata={
        "choices": tuple(SCHEDULE_POLICIES),
        "help": "the order waiting requests are offered to admission: "
                + "; ".join(policy.summary for policy in SCHEDULE_POLICIES.values())})
    lpm_max_wait: Optional[int] = field(default=None, metadata={
        "help": "admission steps a waiting request may be passed over before it goes first, in arrival order, "
                "under a policy that bounds waiting (see --schedule-policy); default: the policy's own"})
    # the one place MINISGL_DISABLE_OVERLAP decides anything: every front end builds this class,
    # and one that names `overlap` (a flag, a keyword) overrides the environment
    overlap: bool = field(default_factory=lambda: not ENV.disable_overlap, metadata={
        "help": "plan step N+1 while step N runs; default: on, unless MINISGL_DISABLE_OVERLAP=1"})
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
        if self.prefix_cache not in prefix_cache_names():
            raise ValueError(f"prefix_cache must be one of {', '.join(prefix_cache_names())}; "
                             f"got {self.prefix_cache!r}")
        check_schedule_policy(self.schedule_policy, self.prefix_cache)
        wait = self.lpm_max_wait
        if wait is not None and (not isinstance(wait, int) or isinstance(wait, bool) or wait < 0):
            raise ValueError(f"lpm_max_wait must be a whole number of admission steps, 0 or more (0 offers every "
                             f"request in arrival order), or None for the policy's default; got {wait!r}")
        readers = [name for name, policy in SCHEDULE_POLICIES.items() if "lpm_max_wait" in policy.settings]
        if wait is not None and self.schedule_policy not in readers:
            raise ValueError(f"lpm_max_wait is read only by schedule_policy {' or '.join(readers) or '(none here)'}; "
                             f"{self.schedule_policy!r} would ignore it: leave it unset or choose such a policy")
        if self.max_extend_tokens < 1:
            raise ValueError(f"max_extend_tokens must be >= 1, got {self.max_extend_tokens}")

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
