"""Chapter 14: the scheduler as a server process is the offline scheduler plus ZMQ queues."""

from minisgl.scheduler import Scheduler
from minisgl.scheduler.io import SchedulerIO

assert issubclass(SchedulerIO, Scheduler)
print(SchedulerIO.__mro__[1].__name__)
