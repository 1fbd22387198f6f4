"""Text <-> token ids for the server: the chat template going in, streaming text coming out."""

from .detokenize import IncrementalDetokenizer, StopStringFilter
from .tokenize import TokenizeManager

__all__ = ["IncrementalDetokenizer", "StopStringFilter", "TokenizeManager"]
