from .aging import AgedLongestPrefix  # registers its policy before SchedulerConfig lists them
from .config import SchedulerConfig
from .scheduler import ForwardResult, Scheduler, StepTrace, extends_scheduler, scheduler_bases, scheduler_extensions

# each module below registers its mixin over `Scheduler` (`extends_scheduler`); the later, the outer
from .chunked import ChunkedPrefillMixin
from .overlap import OverlapMixin
from .structured import StructuredOutputMixin
from .logprobs import LogprobMixin
from .tp import TensorParallelMixin

__all__ = ["Scheduler", "SchedulerConfig", "ForwardResult", "StepTrace", "extends_scheduler", "scheduler_bases",
           "scheduler_extensions", "ChunkedPrefillMixin", "OverlapMixin", "StructuredOutputMixin", "LogprobMixin",
           "TensorParallelMixin", "AgedLongestPrefix"]
