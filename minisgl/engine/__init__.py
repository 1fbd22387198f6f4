from .config import EngineConfig
from .engine import Engine
from .sample import BatchSamplingArgs, Sampler, make_sampling_args

__all__ = ["Engine", "EngineConfig", "BatchSamplingArgs", "Sampler", "make_sampling_args"]
