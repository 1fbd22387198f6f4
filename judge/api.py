"""What an exercise is made of: its metadata (read from `exercise.toml` by judge/declaration.py),
the cases its `cases.py` registers, and the observations a case records. See exercises/FORMAT.md
for the layout of an exercise."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

UNIT = "unit"
E2E = "e2e"


@dataclass(frozen=True)
class Replace:
    """One engine symbol the learner writes: `qualname` is `Class.attr` or a module-level name in
    `module`. The learner's file defines the same qualname; the judge transplants it."""

    module: str
    qualname: str
    optional: bool = False  # a helper the learner may write, or leave out (it is hidden either way)

    def __post_init__(self) -> None:
        if self.qualname.count(".") > 1:
            raise ValueError(f"{self.qualname}: give `Class.attr` or a module-level name")

    @property
    def owner(self) -> Optional[str]:
        return self.qualname.split(".")[0] if "." in self.qualname else None

    @property
    def attr(self) -> str:
        return self.qualname.split(".")[-1]


HIDDEN_PREFIX = "hidden:"  # the key of an instructor's case (from `--cases-dir`) starts with it


@dataclass(frozen=True)
class Case:
    name: str  # shown to the learner
    fn: Callable[..., None]
    kind: str = UNIT
    # 0: a fixed case (reference recorded); n > 0: n seeds drawn at grade time; a tuple: these seeds
    seeds: Union[int, Tuple[int, ...]] = 0
    hint: Optional[int] = None  # which hint in hints.md helps when this case fails
    timeout_s: Optional[float] = None
    weight: Optional[float] = None  # points for passing it (default: exercise.toml's `weights`, else 1)
    hidden: bool = False  # an instructor's case, from a folder outside the repository

    @property
    def key(self) -> str:
        return (HIDDEN_PREFIX if self.hidden else "") + self.fn.__name__

    def seed_list(self, rng) -> List[int]:
        """The seeds to run: the fixed ones, or `seeds` drawn from `rng`."""
        if isinstance(self.seeds, tuple):
            return list(self.seeds)
        return [rng.randrange(1, 2**31) for _ in range(self.seeds)]


@dataclass
class Exercise:
    id: str
    chapter: int
    title: str
    difficulty: int  # 1 easy, 2 medium, 3 hard
    replaces: Tuple[Replace, ...]
    unit_timeout_s: float = 20.0
    e2e_timeout_s: float = 180.0
    memory_limit_gb: float = 6.0
    # A piece on the engine's hot path: a passing grade reports the time spent inside these
    # replaced symbols against the engine's own, over `timing_cases` (default: the fixed unit cases).
    timed: Tuple[str, ...] = ()
    timing_cases: Tuple[str, ...] = ()
    # points per case function name (default 1); a seeded case's points are shared by its seeds
    weights: Dict[str, float] = field(default_factory=dict)
    cases: List[Case] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not 1 <= self.difficulty <= 3:
            raise ValueError(f"{self.id}: difficulty is 1, 2 or 3, got {self.difficulty}")
        if not self.replaces:
            raise ValueError(f"{self.id}: an exercise replaces at least one engine symbol")
        names = {r.qualname for r in self.replaces if not r.optional}
        for q in self.timed:
            if q not in names:
                raise ValueError(f"{self.id}: timed symbol {q!r} is not one of the required replaced symbols {sorted(names)}")

    def cases_for_timing(self) -> List[Case]:
        if self.timing_cases:
            by_key = {c.key: c for c in self.cases}
            missing = [k for k in self.timing_cases if k not in by_key]
            if missing:
                raise ValueError(f"{self.id}: timing_cases names unknown cases {missing}")
            return [by_key[k] for k in self.timing_cases]
        return [c for c in self.cases if c.kind == UNIT and not c.seeds and not c.hidden]

    def weight_of(self, case: Case) -> float:
        """The points a case is worth (all its seeds together)."""
        if case.weight is not None:
            return float(case.weight)
        return float(self.weights.get(case.key, 1.0))

    def timeout_for(self, case: Case) -> float:
        if case.timeout_s is not None:
            return case.timeout_s
        return self.e2e_timeout_s if case.kind == E2E else self.unit_timeout_s


# Cases register here while a cases.py is imported; the registry attaches them to the declared Exercise.
_PENDING: List[Case] = []


def case(name: str, *, kind: str = UNIT, seeds: Union[int, Sequence[int]] = 0, hint: Optional[int] = None,
         timeout_s: Optional[float] = None, weight: Optional[float] = None):
    """Decorator: `fn(obs)` for a fixed case, `fn(obs, seed)` when `seeds` is a count (drawn at grade
    time) or a list of seeds (always these: an instructor's hidden case that must not vary)."""
    if kind not in (UNIT, E2E):
        raise ValueError(f"kind must be {UNIT!r} or {E2E!r}, got {kind!r}")
    if not isinstance(seeds, int):
        seeds = tuple(seeds)
        if not seeds or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
            raise ValueError(f"case {name!r}: seeds is a count or a non-empty list of whole numbers, got {seeds!r}")
    if weight is not None and not (isinstance(weight, (int, float)) and weight > 0):
        raise ValueError(f"case {name!r}: weight must be a positive number, got {weight!r}")

    def register(fn: Callable[..., None]) -> Callable[..., None]:
        _PENDING.append(Case(name, fn, kind, seeds, hint, timeout_s, weight))
        return fn

    return register


def take_pending() -> List[Case]:
    out = list(_PENDING)
    _PENDING.clear()
    return out


# ---- observations -------------------------------------------------------------------------------
_TOLERANCE = {  # dtype -> (atol, rtol); what two correct implementations may differ by
    "torch.float64": (1e-8, 1e-6),
    "torch.float32": (1e-4, 1e-3),
    "torch.float16": (2e-2, 1e-2),
    "torch.bfloat16": (6e-2, 3e-2),
}


def tolerance(dtype: str) -> Tuple[float, float]:
    return _TOLERANCE.get(dtype, _TOLERANCE["torch.float32"])


def to_plain(value: Any) -> Any:
    """JSON-able form of an exactly compared value (tensors become nested lists of ints/bools)."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        torch = None
    if torch is not None and isinstance(value, torch.Tensor):
        if value.is_floating_point():
            raise TypeError("float tensors are compared with obs.close(), not obs.eq()")
        return value.detach().cpu().tolist()
    if isinstance(value, dict):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    if isinstance(value, slice):
        return [value.start, value.stop]
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"cannot record a {type(value).__name__}; record ints, strings, lists, dicts or int tensors")


class Obs:
    """The observations of one case run, in order. Labels speak the learner's language."""

    def __init__(self) -> None:
        self.items: List[Dict[str, Any]] = []

    def eq(self, label: str, value: Any) -> None:
        """Compared exactly: ints, strings, bools, lists, dicts, int tensors."""
        self.items.append({"label": label, "kind": "eq", "value": to_plain(value)})

    def close(self, label: str, tensor: Any) -> None:
        """A float tensor, compared with a tolerance set by its dtype."""
        t = tensor.detach()
        self.items.append({
            "label": label, "kind": "close", "dtype": str(t.dtype), "shape": list(t.shape),
            "value": t.float().cpu().flatten().tolist(),
        })

    def unchanged(self, label: str, before: Any, after: Any) -> None:
        """Record whether an input survived the learner's call (`before` from `snapshot`)."""
        self.items.append({"label": f"{label} is left unchanged", "kind": "eq", "value": describe_change(before, after)})


def snapshot(value: Any) -> Any:
    """A deep copy to compare an input with after the call (tensors are cloned)."""
    return copy.deepcopy(value)


def describe_change(before: Any, after: Any) -> str:
    import torch

    if isinstance(before, torch.Tensor):
        if before.shape != after.shape:
            return f"changed: shape {tuple(before.shape)} became {tuple(after.shape)}"
        diff = (before != after) & ~(torch.isnan(before) & torch.isnan(after)) if before.is_floating_point() else before != after
        if bool(diff.any()):
            idx = tuple(int(i) for i in diff.nonzero()[0])
            return f"changed: element {list(idx)} was {before[idx].item()}, now {after[idx].item()}"
        return "unchanged"
    if isinstance(before, (list, tuple)):
        if len(before) != len(after):
            return f"changed: length {len(before)} became {len(after)}"
        for i, (b, a) in enumerate(zip(before, after)):
            d = describe_change(b, a)
            if d != "unchanged":
                return f"item {i} {d}"
        return "unchanged"
    if hasattr(before, "__dict__") and not isinstance(before, type):
        for k, v in vars(before).items():
            d = describe_change(v, getattr(after, k, None))
            if d != "unchanged":
                return f"field {k} {d}"
        return "unchanged"
    return "unchanged" if before == after else f"changed: was {before!r}, now {after!r}"
