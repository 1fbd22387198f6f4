from .config import SchedulerConfig
from .scheduler import ForwardResult, Scheduler, StepTrace

__all__ = ["Scheduler", "SchedulerConfig", "ForwardResult", "StepTrace"]
