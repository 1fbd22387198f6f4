"""Wrong: tuples are sent as plain lists, so a tuple field (SamplingParams.stop_token_ids) comes back a list."""

import dataclasses
from typing import Any, Dict

import torch

from minisgl.message.serde import _DTYPE_NAMES, _DTYPES, _REGISTRY, SerdeError


def encode_value(value: Any, where: str) -> Any:
    """One value in msgpack-ready form; `where` names it in errors ("UserMsg.input_ids")."""
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return value
    if isinstance(value, torch.Tensor):
        if value.dim() != 1:
            raise SerdeError(f"{where}: only 1-D tensors travel in messages, got shape {tuple(value.shape)}")
        if value.dtype not in _DTYPE_NAMES:
            raise SerdeError(f"{where}: dtype {value.dtype} cannot travel; use one of {sorted(_DTYPES)}")
        data = value.detach().cpu().contiguous().numpy().tobytes()
        return {"__tensor__": _DTYPE_NAMES[value.dtype], "data": data}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        name = type(value).__name__
        if _REGISTRY.get(name) is not type(value):
            raise SerdeError(f"{where}: {name} is not a registered message (decorate it with @message)")
        out: Dict[str, Any] = {"__dc__": name}
        for f in dataclasses.fields(value):
            if f.init:
                out[f.name] = encode_value(getattr(value, f.name), f"{name}.{f.name}")
        return out
    if isinstance(value, (list, tuple)):
        return [encode_value(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        if any(not isinstance(k, str) or k.startswith("__") for k in value):
            raise SerdeError(f"{where}: dict keys must be strings not starting with '__'")
        return {k: encode_value(v, f"{where}.{k}") for k, v in value.items()}
    raise SerdeError(f"{where}: cannot send a {type(value).__name__}")


def decode_value(value: Any) -> Any:
    """Inverse of `encode_value`: rebuild tagged maps into tensors, tuples and messages."""
    if isinstance(value, list):
        return [decode_value(v) for v in value]
    if not isinstance(value, dict):
        return value
    if "__tensor__" in value:
        dtype = _DTYPES[value["__tensor__"]]
        # bytearray: torch wants a writable buffer, and the tensor must own its memory
        return torch.frombuffer(bytearray(value["data"]), dtype=dtype) if value["data"] else torch.empty(0, dtype=dtype)
    if "__tuple__" in value:
        return tuple(decode_value(v) for v in value["__tuple__"])
    if "__dc__" in value:
        name = value["__dc__"]
        cls = _REGISTRY.get(name)
        if cls is None:
            raise SerdeError(f"unknown message type {name!r}: is the sender running a different version?")
        return cls(**{k: decode_value(v) for k, v in value.items() if k != "__dc__"})
    return {k: decode_value(v) for k, v in value.items()}
