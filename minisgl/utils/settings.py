"""Configs that grow with the engine: a module that brings an idea brings its settings too.

A config is a frozen dataclass of the settings every engine has. A module whose feature needs more
declares them in a frozen dataclass of its own and registers it with `extends_config(Base)`. The
config the front ends build, `complete_config(Base)`, is one class with the base's fields and then
each registered part's, in registration order; its `__post_init__` runs every part's check, the
base's first. So `SchedulerConfig(overlap=False)` works once the overlap module is imported, and a
package without that module has no such setting, rather than one that does nothing.

A part's `__post_init__`, if it has one, checks only its own fields (it may read the base's) and
must call `super().__post_init__()` first, as a cooperative override does.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Dict, List, Tuple, TypeVar

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
