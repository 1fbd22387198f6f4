"""Chapter 18: CUDA graphs are used only where they can be; on the CPU the engine runs without."""

import torch

from minisgl.engine import Engine, EngineConfig
from minisgl.engine.graph import GraphRunner

engine = Engine(EngineConfig(model_path="models/tiny-llama", max_running_reqs=2, max_seq_len=64, num_pages=64))
if not torch.cuda.is_available():
    assert engine.graph_runner is None  # graphs capture CUDA kernels; nothing to capture here
print("graph runner:", type(engine.graph_runner).__name__, "| class:", GraphRunner.__name__)
