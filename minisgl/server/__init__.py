"""The OpenAI-compatible HTTP server, its process launcher, and the terminal shell."""

from .args import ServerArgs, parse_args

__all__ = ["ServerArgs", "parse_args"]
