from .base import BaseAttnBackend, BaseAttnMetadata
from .registry import create_attention_backend

__all__ = ["BaseAttnBackend", "BaseAttnMetadata", "create_attention_backend"]
