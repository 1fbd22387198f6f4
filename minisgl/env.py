"""Every environment variable minisgl reads, declared once with its meaning, and read only here.

This module imports nothing from minisgl, so any stage of the package (and the notebooks'
helpers) can use it. A variable is `MINISGL_<FIELD>` (the field's name in capitals) unless its metadata names it
otherwise; its type is the type of its default. They are read once, when this module is first
imported, into the frozen `ENV`. A variable only ever chooses a *default*: a flag or keyword
argument that names the same setting wins (see `SchedulerConfig.overlap`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping

# the checkout: models/ lives here (a staged build of the package links its own models/ to it)
REPO_ROOT = Path(__file__).resolve().parents[1]
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def _var(meaning: str, name: str = "") -> dict:
    return {"help": meaning, "env": name}


@dataclass(frozen=True)
class EnvSwitches:
    # the engine (the default is the fast path)
    disable_overlap: bool = field(default=False, metadata=_var("plan step N+1 while step N runs is off unless a front "
                                                               "end asks for it"))
    disable_cuda_graph: bool = field(default=False, metadata=_var("decode steps run eagerly unless a front end asks "
                                                                  "for CUDA graphs"))
    check_integrity: bool = field(default=False, metadata=_var("check every table row and KV page after each "
                                                               "scheduler step (slow)"))
    disable_kernels: bool = field(default=False, metadata=_var("no Triton kernel on a GPU: the kernel pass leaves "
                                                               "the layers plain PyTorch, backends run the plain "
                                                               "sequence"))
    disable_onednn: bool = field(default=False, metadata=_var("float32 projections on the CPU through F.linear (MKL), "
                                                              "not oneDNN: no second copy of the weights, "
                                                              "transformers' rounding"))
    triton_interpret: bool = field(default=False, metadata=_var("Triton's own interpreter: the kernels then run on "
                                                                "CPU tensors too", "TRITON_INTERPRET"))
    model: str = field(default="", metadata=_var("model directory used when none is given (default: the bundled "
                                                 "SmolLM2-135M-Instruct)"))
    tp_timeout: float = field(default=300.0, metadata=_var("seconds a tensor-parallel collective waits for a peer "
                                                           "before it fails"))
    log_level: str = field(default="WARNING", metadata=_var("level of the `minisgl` loggers: DEBUG, INFO, WARNING or "
                                                            "ERROR"))
    cpu_kv_budget_gb: float = field(default=0.5, metadata=_var("GiB the KV pool may take on the CPU (default 0.5: a "
                                                               "full 8,192-token context of the bundled model in "
                                                               "float32)"))
    # the workbook around the engine
    num_threads: int = field(default=1, metadata=_var("CPU threads a chapter notebook gives torch"))
    judge_fork: bool = field(default=True, metadata=_var("the judge forks its workers from a preloaded process (0: a "
                                                         "fresh interpreter each)"))
    test_device: str = field(default="cpu", metadata=_var("device the test suite runs the engine on"))
    test_dtype: str = field(default="float32", metadata=_var("dtype the test suite runs the engine in"))
    test_attention: str = field(default="torch", metadata=_var("attention backend the test suite uses"))
    test_oracle: str = field(default="", metadata=_var("'recompute': the tests recompute transformers' outputs "
                                                       "instead of reading the recorded ones"))

    @classmethod
    def read(cls, environ: Mapping[str, str] = os.environ) -> EnvSwitches:
        """The switches as `environ` sets them; a value that does not parse raises ValueError."""
        return cls(**{f.name: _parse(variable_name(f.name), environ[variable_name(f.name)], f.default)
                      for f in fields(cls) if variable_name(f.name) in environ})


def variable_name(field_name: str) -> str:
    """The environment variable behind an `EnvSwitches` field."""
    meta = EnvSwitches.__dataclass_fields__[field_name].metadata
    return meta["env"] or f"MINISGL_{field_name.upper()}"


def _parse(name: str, raw: str, default: Any) -> Any:
    if isinstance(default, bool):
        value = raw.strip().lower()
        if value not in _TRUE + _FALSE:
            raise ValueError(f"{name}={raw!r}: expected 1 or 0 (or true / false)")
        return value in _TRUE
    try:
        return type(default)(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected a {type(default).__name__}") from None


ENV = EnvSwitches.read()


def default_model_path() -> Path:
    """The bundled SmolLM2 model prepared by `tools/prepare_models.py`, unless MINISGL_MODEL says otherwise."""
    return Path(ENV.model) if ENV.model else REPO_ROOT / "models" / "smollm2-135m-instruct"


def child_environment(package_root: Path) -> dict:
    """This process's environment for a child process that must import the same copy of minisgl:
    `package_root` first on PYTHONPATH."""
    path = os.pathsep.join(filter(None, [str(package_root), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}
