"""Server options: the server's own settings beside the scheduler's and the engine's, and the
command line generated from all three (each flag is a dataclass field; see `add_config_flags`)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

from minisgl.engine import EngineConfig
from minisgl.scheduler import SchedulerConfig
from minisgl.utils.misc import add_config_flags, build_config

LOG_LEVELS = ("debug", "info", "warning", "error")


@dataclass(frozen=True)
class ServerConfig:
    """the HTTP server and the terminal shell"""

    served_model_name: Optional[str] = field(default=None, metadata={"help": "name clients use in the 'model' field; "
                                                                             "default: the model folder's name"})
    tokenizer: Optional[str] = field(default=None, metadata={"help": "tokenizer directory; default: the model "
                                                                     "directory (random weights in a folder without "
                                                                     "one: token i reads '<i>')"})
    host: str = field(default="127.0.0.1", metadata={"help": "address to listen on"})
    port: int = field(default=1919, metadata={"help": "port to listen on"})
    shell: bool = field(default=False, metadata={"help": "chat in the terminal instead of serving HTTP"})
    shell_max_tokens: Optional[int] = field(default=None, metadata={"help": "most tokens per reply in the shell; "
                                                                            "default: up to the context length"})
    log_level: str = field(default="warning", metadata={"choices": LOG_LEVELS, "help": "log verbosity of the server"})
    max_request_bytes: int = field(default=2 * 1024 * 1024, metadata={"help": "largest request body accepted, in "
                                                                              "bytes; a larger one gets 413 before it "
                                                                              "is parsed"})
    grammar_timeout_s: float = field(default=10.0, metadata={
        "flag": "grammar_timeout", "help": "seconds a request with a response_format JSON schema may wait for its "
                                           "grammar, compiling (beside the engine's loop) and queueing for a "
                                           "compiler included; past it the request is refused with a 400"})
    max_schema_bytes: int = field(default=64 * 1024, metadata={"help": "largest response_format JSON schema accepted, "
                                                                       "in bytes; a larger one is refused with a 400 "
                                                                       "before it is compiled"})
    grammar_cache_mb: int = field(default=256, metadata={"help": "memory the scheduler keeps compiled JSON-schema "
                                                                 "grammars in, in MiB (a grammar is charged its "
                                                                 "serialised size, what it holds); the least recently "
                                                                 "used are dropped past it"})
    drain_timeout_s: float = field(default=30.0, metadata={
        "flag": "drain_timeout", "help": "seconds in-flight requests may still run after SIGTERM or Ctrl-C; the rest "
                                         "then end with an error"})

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise ValueError(f"port must be in 1..65535, got {self.port}")
        if self.max_request_bytes < 1024:
            raise ValueError(f"max_request_bytes must be at least 1024, got {self.max_request_bytes}")
        if self.grammar_timeout_s <= 0 or self.max_schema_bytes < 1 or self.grammar_cache_mb < 1:
            raise ValueError(f"grammar_timeout_s, max_schema_bytes and grammar_cache_mb must be positive, got "
                             f"{self.grammar_timeout_s}, {self.max_schema_bytes} and {self.grammar_cache_mb}")
        if self.drain_timeout_s < 0:
            raise ValueError(f"drain_timeout_s must be >= 0 seconds, got {self.drain_timeout_s}")


@dataclass(frozen=True)
class ServerArgs:
    """Everything `python -m minisgl` runs with. Build one from flat settings with
    `ServerArgs.from_options(port=3000, page_size=4)` or from a command line with `parse_args`."""

    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    server: ServerConfig = field(default_factory=ServerConfig)

    @classmethod
    def from_options(cls, **options) -> ServerArgs:
        return build_config(cls, options)

    @property
    def engine(self) -> EngineConfig:
        return self.scheduler.engine

    @property
    def model_name(self) -> str:
        return self.server.served_model_name or Path(self.engine.model_path).resolve().name

    @property
    def tokenizer_path(self) -> str:
        return self.server.tokenizer or self.engine.model_path


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m "
                                     "minisgl", description="Serve a model with an OpenAI-compatible API, or chat "
                                                            "with it in the terminal (--shell).")
    add_config_flags(p, ServerArgs)
    return p


def parse_args(argv: Optional[List[str]] = None) -> ServerArgs:
    """The settings a command line gives; every other one keeps its dataclass default."""
    parser = build_parser()
    try:
        return build_config(ServerArgs, vars(parser.parse_args(argv)))
    except (ValueError, FileNotFoundError) as e:
        parser.error(str(e))  # usage and the message, exit status 2
