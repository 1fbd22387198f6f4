from .scheduler import ForwardResult, Scheduler, StepTrace, extends_scheduler, scheduler_bases, scheduler_extensions

# each module below registers its mixin over `Scheduler` (`extends_scheduler`); the later, the outer
# (those that register a scheduling policy come before SchedulerConfig, which lists the policies)
from .prefix import PrefixCacheMixin
from .aging import AgedLongestPrefix
from .config import SchedulerConfig
from .chunked import ChunkedPrefillMixin
from .overlap import OverlapMixin
from .structured import StructuredOutputMixin
from .logprobs import LogprobMixin
from .tp import TensorParallelMixin

__all__ = ["Scheduler", "SchedulerConfig", "ForwardResult", "StepTrace", "extends_scheduler", "scheduler_bases",
           "scheduler_extensions", "PrefixCacheMixin", "ChunkedPrefillMixin", "OverlapMixin", "StructuredOutputMixin",
           "LogprobMixin", "TensorParallelMixin", "AgedLongestPrefix"]
