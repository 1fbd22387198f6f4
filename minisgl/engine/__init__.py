from .config import EngineConfig
from .engine import Engine
from .sample import BatchSamplingArgs, Sampler, SamplerOutput, SamplingPlan, make_sampling_args, make_sampling_plan

__all__ = ["Engine", "EngineConfig", "BatchSamplingArgs", "Sampler", "SamplerOutput", "SamplingPlan",
           "make_sampling_args", "make_sampling_plan"]
