from .llm import LLM, RequestOutput

# each module below adds fields to `RequestOutput` (`extends_in_place`)
from .logprobs import LogprobOutput

__all__ = ["LLM", "RequestOutput", "LogprobOutput"]
