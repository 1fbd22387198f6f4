"""Configs that grow with the engine: a module that brings an idea brings its settings too.

A config is a frozen dataclass of the settings every engine has. A module whose feature needs more
declares them in a frozen dataclass of its own and registers it with `extends_config(Base)`. The
config the front ends build, `complete_config(Base)`, is one class with the base's fields and then
each registered part's, in registration order; its `__post_init__` runs every part's check, the
base's first. So a setting a module declares exists once that module is imported, and a package
without that module has no such setting, rather than one that does nothing.

A part's `__post_init__`, if it has one, checks only its own fields (it may read the base's) and
must call `super().__post_init__()` first, as a cooperative override does.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Optional, Tuple, TypeVar

C = TypeVar("C", bound=type)
_PARTS: Dict[type, List[Tuple[str, type]]] = {}  # base -> (qualified name, part), in registration order
_COMPLETE: Dict[Tuple[type, Tuple[type, ...]], type] = {}


def extends_config(base: type) -> Callable[[C], C]:
    """Class decorator: add a frozen dataclass's fields to `base`'s complete config. Registering a
    part of the same name again (a module imported afresh) replaces it."""
    def register(part: C) -> C:
        if not (dataclasses.is_dataclass(part) and part.__dataclass_params__.frozen):
            raise TypeError(f"{part.__name__} must be a frozen dataclass to extend {base.__name__}")
        taken = {f.name for f in dataclasses.fields(base)}
        for _, other in _PARTS.get(base, []):
            if other.__qualname__ != part.__qualname__:
                taken |= {f.name for f in dataclasses.fields(other)}
        clash = taken & {f.name for f in dataclasses.fields(part)}
        if clash:
            raise TypeError(f"{part.__name__} declares {', '.join(sorted(clash))}, which {base.__name__} already has")
        key = f"{part.__module__}.{part.__qualname__}"
        parts = [(k, p) for k, p in _PARTS.get(base, []) if k != key]
        _PARTS[base] = parts + [(key, part)]
        return part
    return register


def config_parts(base: type) -> Tuple[type, ...]:
    """The parts registered for `base`, in registration order."""
    return tuple(p for _, p in _PARTS.get(base, []))


def complete_config(base: type, module: str) -> type:
    """`base` with every registered part: a frozen dataclass named like `base`, to be bound to that
    name in `module` (so that it pickles and prints as the config it is). Built once per set of parts."""
    parts = config_parts(base)
    key = (base, parts)
    if key not in _COMPLETE:
        # the MRO puts the last registered part first: dataclass fields run base first, then the parts
        cls = dataclasses.make_dataclass(base.__name__, [], bases=(*reversed(parts), base), frozen=True)
        cls.__module__, cls.__qualname__ = module, base.__qualname__
        cls.__doc__ = base.__doc__
        _COMPLETE[key] = cls
    return _COMPLETE[key]


# ---- growing a class in place ---------------------------------------------------------------------
_OWN: Dict[type, Tuple[Tuple[dataclasses.Field, ...], Optional[Callable]]] = {}  # base -> its own fields, check


def extends_in_place(base: type) -> Callable[[C], C]:
    """Class decorator: add a dataclass's fields to `base` itself, after its own and those of the
    parts registered before. For a class that, unlike a config, many modules name at import and
    that travels by name (messages, pickles): a complete copy would leave some of them holding
    the class without the part. So `SamplingParams(new_field=...)` works everywhere once the
    part's module is imported, and `dataclasses.replace`, `fields` and equality see every field.

    A part declares fields with defaults (an object made before the part was registered reads
    them) and, if its fields need checking, a `__post_init__` that checks only them and calls no
    `super()`: the grown class runs the base's check, then each part's. Only fields and that
    check are taken from the part, not other methods. Registering a part of the same name again
    (a module imported afresh) replaces it."""
    def register(part: C) -> C:
        if not dataclasses.is_dataclass(part):
            raise TypeError(f"{part.__name__} must be a dataclass to extend {base.__name__}")
        own, _ = _OWN.setdefault(base, (dataclasses.fields(base), base.__dict__.get("__post_init__")))
        key = f"{part.__module__}.{part.__qualname__}"
        taken = {f.name for f in own}
        for k, other in _PARTS.get(base, []):
            if k != key:
                taken |= {f.name for f in dataclasses.fields(other)}
        clash = taken & {f.name for f in dataclasses.fields(part)}
        if clash:
            raise TypeError(f"{part.__name__} declares {', '.join(sorted(clash))}, which {base.__name__} already has")
        missing = [f.name for f in dataclasses.fields(part)
                   if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        if missing:
            raise TypeError(f"{part.__name__}.{missing[0]} needs a default to extend {base.__name__}")
        _PARTS[base] = [(k, p) for k, p in _PARTS.get(base, []) if k != key] + [(key, part)]
        _grow(base)
        return part
    return register


def _grow(base: type) -> None:
    """Regenerate `base`'s dataclass methods over its own fields and every registered part's."""
    own, own_check = _OWN[base]
    parts = config_parts(base)
    fields = [*own, *(f for p in parts for f in dataclasses.fields(p))]
    checks = [c for c in (own_check, *(p.__dict__.get("__post_init__") for p in parts)) if c is not None]

    def __post_init__(self: Any) -> None:
        for check in checks:
            check(self)

    def spec(f: dataclasses.Field) -> dataclasses.Field:
        return dataclasses.field(default=f.default, default_factory=f.default_factory, init=f.init, repr=f.repr,
                                 hash=f.hash, compare=f.compare, metadata=f.metadata, kw_only=f.kw_only)

    params = base.__dataclass_params__
    grown = dataclasses.make_dataclass(base.__name__, [(f.name, f.type, spec(f)) for f in fields],
                                       namespace={"__post_init__": __post_init__}, eq=params.eq,
                                       frozen=params.frozen, unsafe_hash=params.unsafe_hash)
    for name in ("__init__", "__repr__", "__eq__", "__hash__", "__match_args__", "__dataclass_fields__",
                 "__post_init__"):
        if name in grown.__dict__:
            setattr(base, name, grown.__dict__[name])
            if callable(grown.__dict__[name]):
                grown.__dict__[name].__qualname__ = f"{base.__qualname__}.{name}"
    base.__annotations__ = {f.name: f.type for f in fields}
    for f in fields:
        if f.default is not dataclasses.MISSING:
            setattr(base, f.name, f.default)
