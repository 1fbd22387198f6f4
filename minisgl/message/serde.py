"""Dataclass <-> msgpack. Every message is a dataclass; it travels as a tagged map.

A message is encoded field by field. Five kinds of values need a tag, because msgpack alone
would lose what they are: a nested dataclass (``{"__dc__": name, ...fields}``), a 1-D tensor
(``{"__tensor__": dtype, "data": raw bytes}``: no per-element encoding, so a 4k-token prompt is
one memcpy), a tuple (msgpack only knows lists), an integer beyond 64 bits (``{"__int__":
decimal text}``) and a dict with a key that starts like a tag (``{"__map__": [[key, value],
...]}``): a client's JSON may hold any integer and any key.
Classes must be registered with `@message` so the receiver can find them by name -- and so
nothing else can be instantiated from the wire.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Type, TypeVar

import msgpack
import torch

T = TypeVar("T")

_REGISTRY: Dict[str, Type[Any]] = {}

# dtypes a message may carry; anything else is a bug at the sender, caught at encode time
_DTYPES: Dict[str, torch.dtype] = {
    "int32": torch.int32,
    "int64": torch.int64,
    "float32": torch.float32,
    "bool": torch.bool,
    "uint8": torch.uint8,
}
_DTYPE_NAMES = {v: k for k, v in _DTYPES.items()}
_INT_MIN, _UINT_MAX = -(2**63), 2**64 - 1  # what msgpack encodes natively


class SerdeError(ValueError):
    """A message that cannot be encoded or decoded; the text names the class and field."""


def message(cls: Type[T]) -> Type[T]:
    """Register a dataclass so it can be sent. Names must be unique across the package."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls.__name__} must be a dataclass to be a message")
    if cls.__name__ in _REGISTRY and _REGISTRY[cls.__name__] is not cls:
        raise TypeError(f"two message classes are named {cls.__name__}")
    _REGISTRY[cls.__name__] = cls
    return cls


def encode_value(value: Any, where: str) -> Any:
    """One value in msgpack-ready form; `where` names it in errors ("UserMsg.input_ids")."""
    if isinstance(value, int) and not isinstance(value, bool) and not _INT_MIN <= value <= _UINT_MAX:
        return {"__int__": str(value)}
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
    if isinstance(value, tuple):
        return {"__tuple__": [encode_value(v, f"{where}[{i}]") for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [encode_value(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        if any(not isinstance(k, str) for k in value):
            raise SerdeError(f"{where}: dict keys must be strings")
        if any(k.startswith("__") for k in value):  # a client's JSON may use any key: keep it apart from the tags
            return {"__map__": [[k, encode_value(v, f"{where}.{k}")] for k, v in value.items()]}
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
    if "__map__" in value:
        return {k: decode_value(v) for k, v in value["__map__"]}
    if "__int__" in value:
        return int(value["__int__"])
    if "__tuple__" in value:
        return tuple(decode_value(v) for v in value["__tuple__"])
    if "__dc__" in value:
        name = value["__dc__"]
        cls = _REGISTRY.get(name)
        if cls is None:
            raise SerdeError(f"unknown message type {name!r}: is the sender running a different version?")
        return cls(**{k: decode_value(v) for k, v in value.items() if k != "__dc__"})
    return {k: decode_value(v) for k, v in value.items()}


def serialize(msg: Any) -> bytes:
    """Encode a registered dataclass (fields may nest dataclasses, lists, dicts, tuples, tensors)."""
    if not dataclasses.is_dataclass(msg):
        raise SerdeError(f"only messages (dataclasses) are sent, got {type(msg).__name__}")
    return msgpack.packb(encode_value(msg, type(msg).__name__), use_bin_type=True)


def deserialize(data: bytes) -> Any:
    """Inverse of `serialize`: the same class with equal fields (tensors equal elementwise)."""
    return decode_value(msgpack.unpackb(data, raw=False))


@message
@dataclasses.dataclass
class BatchMsg:
    """Several messages in one send: a decode step produces one token per running request."""

    msgs: list
