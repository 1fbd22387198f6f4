from minisgl.utils.settings import complete_config

from . import config
from .scheduler import ForwardResult, Scheduler, StepTrace, extends_scheduler, scheduler_bases, scheduler_extensions

# each module below registers its mixin over `Scheduler` (`extends_scheduler`), the later the outer,
# and may add settings to `config.SchedulerConfig` (`extends_config`)
from .prefix import PrefixCacheMixin
from .aging import AgedLongestPrefix
from .chunked import ChunkedPrefillMixin
from .overlap import OverlapMixin
from .structured import StructuredOutputMixin
from .logprobs import LogprobMixin
from .tp import TensorParallelMixin

# what every front end builds: chapter 7's settings and those of every module imported above
SchedulerConfig = complete_config(config.SchedulerConfig, __name__)

__all__ = ["Scheduler", "SchedulerConfig", "ForwardResult", "StepTrace", "extends_scheduler", "scheduler_bases",
           "scheduler_extensions", "PrefixCacheMixin", "ChunkedPrefillMixin", "OverlapMixin", "StructuredOutputMixin",
           "LogprobMixin", "TensorParallelMixin", "AgedLongestPrefix"]
