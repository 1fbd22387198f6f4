from .llm import LLM, RequestOutput

__all__ = ["LLM", "RequestOutput"]
