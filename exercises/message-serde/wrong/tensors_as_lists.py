"""Wrong: tensors travel as lists of numbers (one msgpack item per element), not raw bytes.
Round trips still work; the wire form and its size give it away."""

import dataclasses
from typing import Any, Dict

import torch

from minisgl.message.serde import _DTYPE_NAMES, _DTYPES, _REGISTRY, SerdeError


def encode_value(value: Any, where: str) -> Any:
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return value
    if isinstance(value, torch.Tensor):
        if value.dim() != 1 or value.dtype not in _DTYPE_NAMES:
            raise SerdeError(f"{where}: cannot send this tensor")
        return {"__tensor__": _DTYPE_NAMES[value.dtype], "data": value.tolist()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        name = type(value).__name__
        if _REGISTRY.get(name) is not type(value):
            raise SerdeError(f"{where}: {name} is not a registered message")
        out: Dict[str, Any] = {"__dc__": name}
        for f in dataclasses.fields(value):
            out[f.name] = encode_value(getattr(value, f.name), f"{name}.{f.name}")
        return out
    if isinstance(value, tuple):
        return {"__tuple__": [encode_value(v, f"{where}[{i}]") for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [encode_value(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {k: encode_value(v, f"{where}.{k}") for k, v in value.items()}
    raise SerdeError(f"{where}: cannot send a {type(value).__name__}")


def decode_value(value: Any) -> Any:
    if isinstance(value, list):
        return [decode_value(v) for v in value]
    if not isinstance(value, dict):
        return value
    if "__tensor__" in value:
        return torch.tensor(value["data"], dtype=_DTYPES[value["__tensor__"]])
    if "__tuple__" in value:
        return tuple(decode_value(v) for v in value["__tuple__"])
    if "__dc__" in value:
        cls = _REGISTRY.get(value["__dc__"])
        if cls is None:
            raise SerdeError(f"unknown message type {value['__dc__']!r}")
        return cls(**{k: decode_value(v) for k, v in value.items() if k != "__dc__"})
    return {k: decode_value(v) for k, v in value.items()}
