"""Chapter 14: the scheduler as a server process is the offline scheduler plus ZMQ queues."""

from minisgl.scheduler import Scheduler
from minisgl.scheduler.io import SchedulerIO

assert issubclass(SchedulerIO, Scheduler)
print([c.__name__ for c in SchedulerIO.__mro__[1:3]])
