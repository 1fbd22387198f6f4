"""Every environment variable minisgl reads, declared once with its meaning, and read only here.

A variable is `MINISGL_<FIELD>` (the field's name in capitals) unless its metadata names it
otherwise; its type is the type of its default. They are read once, when this module is first
imported, into the frozen `ENV`. A variable only ever chooses a *default*: a flag or keyword
argument that names the same setting wins. This module imports nothing from minisgl, so the
workbook around the engine declares its own variables with the same machinery (`switch`,
`read_switches`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping, Optional, Type, TypeVar

# the checkout: models/ lives here (a staged build of the package links its own models/ to it)
REPO_ROOT = Path(__file__).resolve().parents[1]
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def switch(meaning: str, name: str = "") -> dict:
    """A switch field's metadata: what it means, and its variable where that is not MINISGL_<FIELD>."""
    return {"help": meaning, "env": name}



@dataclass(frozen=True)
class EnvSwitches:
    # the engine (the default is the fast path)
    disable_overlap: bool = field(default=False, metadata=switch(
        "plan step N+1 while step N runs is off unless a front end asks for it"))
    disable_cuda_graph: bool = field(default=False, metadata=switch(
        "decode steps run eagerly unless a front end asks for CUDA graphs"))
    check_integrity: bool = field(default=False, metadata=switch(
        "check every table row and KV page after each scheduler step (slow)"))
    disable_kernels: bool = field(default=False, metadata=switch(
        "no Triton kernel on a GPU: the kernel pass leaves the layers plain PyTorch, backends run the "
        "plain sequence"))
    disable_onednn: bool = field(default=False, metadata=switch(
        "float32 projections on the CPU through F.linear (MKL), not oneDNN: no second copy of the "
        "weights, transformers' rounding"))
    triton_interpret: bool = field(default=False, metadata=switch(
        "Triton's own interpreter: the kernels then run on CPU tensors too", "TRITON_INTERPRET"))
    model: str = field(default="", metadata=switch(
        "model directory used when none is given (default: the bundled SmolLM2-135M-Instruct)"))
    tp_timeout: float = field(default=300.0, metadata=switch(
        "seconds a tensor-parallel collective waits for a peer before it fails"))
    log_level: str = field(default="WARNING", metadata=switch(
        "level of the `minisgl` loggers: DEBUG, INFO, WARNING or ERROR"))
    cpu_kv_budget_gb: float = field(default=0.5, metadata=switch(
        "GiB the KV pool may take on the CPU (default 0.5: a full 8,192-token context of the bundled "
        "model in float32)"))

    @classmethod
    def read(cls, environ: Mapping[str, str] = os.environ) -> EnvSwitches:
        return read_switches(cls, environ)


T = TypeVar("T")


def read_switches(cls: Type[T], environ: Mapping[str, str] = os.environ) -> T:
    """A dataclass of switches as `environ` sets them; a value that does not parse raises ValueError."""
    values = {}
    for f in fields(cls):
        name = variable_name(f.name, cls)
        if name in environ:
            values[f.name] = _parse(name, environ[name], f.default)
    return cls(**values)


def variable_name(field_name: str, cls: Optional[type] = None) -> str:
    """The environment variable behind a switch field (of `EnvSwitches` unless `cls` says otherwise)."""
    meta = (cls or EnvSwitches).__dataclass_fields__[field_name].metadata
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
