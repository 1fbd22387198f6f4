"""Chapter 16: which tensor-parallel sizes a model can be split over is decided before any process starts."""

from minisgl.distributed.split import check_tp_split
from minisgl.models import ModelConfig

cfg = ModelConfig.from_dir("models/smollm2-135m-instruct")  # 9 query heads, 3 KV heads
check_tp_split(cfg, 3)
try:
    check_tp_split(cfg, 2)
except ValueError as e:
    print(e)
else:
    raise AssertionError("9 heads were split over 2 ranks")
