"""Small helpers shared by every stage."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import importlib.util
import types
import typing
from typing import Any, Dict, Optional, Sequence, Tuple

import torch


def div_ceil(a: int, b: int) -> int:
    return -(-a // b)


def align_down(a: int, b: int) -> int:
    return a // b * b


def align_up(a: int, b: int) -> int:
    return div_ceil(a, b) * b


def package_has(module: str) -> bool:
    """Is `module` (a dotted name, e.g. "minisgl.engine.engine") part of the package being run?

    A package may lack the modules of later chapters: every "auto" choice asks this before
    reaching for an optional module, instead of failing with ModuleNotFoundError.
    """
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing too
        return False


def default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


# ---------------------------------------------------------------------------------------------
# settings by name: one frozen config dataclass per layer, each field declared once with its
# default and `metadata={"help": ...}`. Keyword arguments (`LLM(path, page_size=4)`) and
# command-line flags (`--page-size 4`) are both derived from those fields; a field whose type
# is itself a config dataclass (`SchedulerConfig.engine`) contributes its fields under their
# own names, so every setting has one flat name. Metadata keys besides "help": "flag" (the
# flag's name when it is not the field's), "choices", "aliases" (other keyword spellings, such
# as upstream mini-sglang's) and "cli": False (set by the program, never by a user).


class UnknownOptionError(TypeError):
    """A keyword that names no setting; the message lists close matches and every valid name."""

    def __init__(self, unknown: Sequence[str], valid: Sequence[str], other_spellings: Sequence[str] = ()):
        self.unknown, self.valid = list(unknown), sorted(valid)
        parts = []
        for name in self.unknown:
            close = difflib.get_close_matches(name, [*self.valid, *other_spellings], n=3, cutoff=0.6)
            parts.append(repr(name) + (f" (did you mean {' or '.join(close)}?)" if close else ""))
        noun = "setting" if len(parts) == 1 else "settings"
        super().__init__(f"unknown {noun} {', '.join(parts)}; valid settings: {', '.join(self.valid)}")


def option_fields(cls: type) -> Dict[str, Tuple[type, dataclasses.Field]]:
    """Every setting of config class `cls` by its flat name: (the dataclass that declares it, field)."""
    out: Dict[str, Tuple[type, dataclasses.Field]] = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        if dataclasses.is_dataclass(hints[f.name]):
            nested = option_fields(hints[f.name])
            assert not nested.keys() & out.keys(), f"{cls.__name__}: settings named twice: {nested.keys() & out.keys()}"
            out.update(nested)
        else:
            assert f.name not in out, f"{cls.__name__}.{f.name} is declared twice"
            out[f.name] = (cls, f)
    return out


def build_config(cls: type, options: Dict[str, Any], base: Any = None) -> Any:
    """An instance of config class `cls` from flat settings (`{"page_size": 4, ...}`); what
    is not named keeps the dataclass default, or the value in `base` when one is given. An
    upstream spelling declared in a field's "aliases" counts as its name. Raises
    UnknownOptionError for a name that is no setting, TypeError for a setting named twice."""
    known = option_fields(cls)
    alias = {a: name for name, (_, f) in known.items() for a in f.metadata.get("aliases", ())}
    flat: Dict[str, Any] = {}
    spelled: Dict[str, str] = {}
    for key, value in options.items():
        name = alias.get(key, key)
        if name in flat:
            raise TypeError(f"setting {name!r} given twice, as {spelled[name]!r} and as {key!r}")
        flat[name], spelled[name] = value, key
    unknown = [k for k in options if alias.get(k, k) not in known]
    if unknown:
        raise UnknownOptionError(unknown, [n for n, (_, f) in known.items() if f.metadata.get("cli", True)],
                                 list(alias))
    return _build(cls, flat, base)


def _build(cls: type, flat: Dict[str, Any], base: Any) -> Any:
    hints = typing.get_type_hints(cls)
    kwargs: Dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        if dataclasses.is_dataclass(hints[f.name]):
            kwargs[f.name] = _build(hints[f.name], flat, getattr(base, f.name) if base is not None else None)
        elif f.name in flat:
            kwargs[f.name] = flat[f.name]
    return dataclasses.replace(base, **kwargs) if base is not None else cls(**kwargs)


def add_config_flags(parser: argparse.ArgumentParser, cls: type, helps: Optional[Dict[str, str]] = None,
                     exclude: Sequence[str] = ()) -> None:
    """Add a flag for every setting of config class `cls` to `parser`, one argument group per
    dataclass (titled from the class's docstring); `helps` replaces the help text of settings
    whose default a program changes (a benchmark's own model), and `exclude` names settings the
    program decides itself (a benchmark's swept batch sizes), which get no flag. A flag left
    out leaves its setting out of the parsed namespace (argparse.SUPPRESS), so the dataclass's
    own default, environment switches included, applies: `config_options` then picks out what
    was given.

    Flags: `--page-size` for `page_size` (or `--<metadata flag>`); a bool that defaults to
    False is switched on by `--<name>`, one that defaults to True off by `--disable-<name>`,
    and one whose default is computed (from the environment) takes either."""
    known = option_fields(cls)
    for name in [*(helps or {}), *exclude]:
        if name not in known:  # a misspelt name would otherwise leave its flag in, or its help unchanged
            raise UnknownOptionError([name], list(known))
    groups: Dict[type, Any] = {}
    for name, (owner, f) in known.items():
        if f.metadata.get("cli", True) is False or name in exclude:
            continue
        if owner not in groups:
            title = (owner.__doc__ or owner.__name__).strip().splitlines()[0]
            groups[owner] = parser.add_argument_group(f"{owner.__name__}: {title}")
        flag = "--" + f.metadata.get("flag", name).replace("_", "-")
        kind = _flag_type(typing.get_type_hints(owner)[name])
        help_text = (helps or {}).get(name) or f.metadata["help"]
        if kind is bool:
            if f.default is False:
                spellings = [flag]
            elif f.default is True:
                spellings = ["--disable-" + flag[2:]]
            else:
                spellings = [flag, "--disable-" + flag[2:]]
            groups[owner].add_argument(*spellings, dest=name, action=_BoolFlag, default=argparse.SUPPRESS,
                                       help=help_text)
            continue
        if f.default is not dataclasses.MISSING and f.default is not None:
            help_text += f" (default: {f.default})"
        groups[owner].add_argument(flag, dest=name, type=kind, choices=f.metadata.get("choices"),
                                   default=argparse.SUPPRESS,
                                   metavar=None if "choices" in f.metadata else flag[2:].replace("-",
                                                                                                 "_").upper(),
                                                                                                 help=help_text)


def config_options(ns: argparse.Namespace, cls: type) -> Dict[str, Any]:
    """The settings of config class `cls` that a parsed command line gave explicitly."""
    return {name: value for name, value in vars(ns).items() if name in option_fields(cls)}


def _flag_type(hint: Any) -> type:
    """The type a flag parses to: the hint without Optional; str where it takes a str or more."""
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    args = [a for a in typing.get_args(hint) if a is not type(None)] if union else [hint]
    if str in args or len(args) != 1:
        return str
    return args[0]


class _BoolFlag(argparse.Action):
    """`--x` stores True, `--disable-x` stores False."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any):
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: Optional[str] = None) -> None:
        setattr(namespace, self.dest, not (option_string or "").startswith("--disable-"))
