"""Chapter 16: the tensor-parallel mixin is registered over the scheduler, in front of every
other; which sizes a model can be split over is decided before any process starts."""

from minisgl.distributed.split import check_tp_split
from minisgl.llm import LLM
from minisgl.models import ModelConfig
from minisgl.scheduler import TensorParallelMixin, scheduler_bases, scheduler_extensions

assert scheduler_extensions()[-1] == "tensor_parallel", scheduler_extensions()
assert scheduler_bases()[0] is TensorParallelMixin and LLM.__mro__[1] is TensorParallelMixin
cfg = ModelConfig.from_dir("models/smollm2-135m-instruct")  # 9 query heads, 3 KV heads
check_tp_split(cfg, 3)
try:
    check_tp_split(cfg, 2)
except ValueError as e:
    print(e)
else:
    raise AssertionError("9 heads were split over 2 ranks")
