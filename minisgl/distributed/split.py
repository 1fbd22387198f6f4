"""Can this model be split over N ranks? Checked once, before any process is started, so a bad
`tp_size` fails with one clear message instead of a shape error inside every rank."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Protocol, Tuple


class ShardedShape(Protocol):
    """What the check reads of a model's config (`minisgl.models.ModelConfig` has all of it; the
    models build on this package, so it is named here rather than imported)."""

    architecture: str
    num_heads: int
    num_kv_heads: int
    intermediate_size: int


# (what, width) pairs each rank takes an equal share of, besides the heads, by architecture: a model
# module whose blocks split other widths than the dense MLP's registers them when imported
_SPLIT_WIDTHS: Dict[str, Callable[[Any], List[Tuple[str, int]]]] = {}


def register_split_widths(architecture: str, widths: Callable[[Any], List[Tuple[str, int]]]) -> None:
    _SPLIT_WIDTHS[architecture] = widths


def split_widths(cfg: ShardedShape) -> List[Tuple[str, int]]:
    """The widths besides the heads that `cfg`'s layers split over the ranks: the MLP's, unless its
    architecture registered others."""
    widths = _SPLIT_WIDTHS.get(cfg.architecture)
    return widths(cfg) if widths is not None else [("MLP width", cfg.intermediate_size)]


def tp_split_problems(cfg: ShardedShape, tp_size: int) -> List[str]:
    """Every reason `cfg` cannot be sharded over `tp_size` ranks (empty when it can)."""
    problems: List[str] = []
    if tp_size < 1:
        return [f"tp_size must be >= 1, got {tp_size}"]
    if cfg.num_heads % tp_size:
        problems.append(f"{cfg.num_heads} attention heads do not split over {tp_size} ranks")
    kv = cfg.num_kv_heads
    # more KV heads than ranks: each rank takes kv/tp of them; fewer: tp/kv ranks share one
    if (kv >= tp_size and kv % tp_size) or (kv < tp_size and tp_size % kv):
        problems.append(f"{kv} KV heads neither split over nor replicate evenly onto {tp_size} ranks")
    for what, width in split_widths(cfg):
        if width % tp_size:
            problems.append(f"{what} {width} does not split over {tp_size} ranks")
    return problems


def check_tp_split(cfg: ShardedShape, tp_size: int) -> None:
    problems = tp_split_problems(cfg, tp_size)
    if problems:
        divisors = [n for n in range(1, 9) if not tp_split_problems(cfg, n)]
        raise ValueError(
            f"{cfg.architecture} cannot run with tp_size={tp_size}: {'; '.join(problems)}. "
            f"Sizes up to 8 that work for this model: {divisors}"
        )
