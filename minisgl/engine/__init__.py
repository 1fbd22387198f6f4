from minisgl.utils.settings import complete_config

from .config import EngineConfig
from .engine import Engine, after_load, fast_path, prepares_gpu
from .sample import (BatchSamplingArgs, Sampler, SamplerOutput, SamplingPlan, after_sampling, make_sampling_args,
                     make_sampling_plan)

# each module below plugs into the engine (a fast path, a GPU preparation step; a GPU engine builds
# its fast paths first, then runs its steps in this order) and may bring settings (`extends_config`)
from .graph import GraphConfig, GraphRunner
from .warmup import warm_up

# a pass every engine runs over its model once loaded (`after_load`)
from .kernel_pass import kernel_pass

# the config with every imported module's settings: what front ends build and ranks unpickle
EngineConfig = complete_config(EngineConfig, __name__)

__all__ = ["Engine", "EngineConfig", "after_load", "fast_path", "prepares_gpu", "BatchSamplingArgs", "Sampler",
           "SamplerOutput", "SamplingPlan", "after_sampling", "make_sampling_args", "make_sampling_plan", "GraphConfig",
           "GraphRunner", "warm_up", "kernel_pass"]
