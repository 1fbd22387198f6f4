"""Can this model be split over N ranks? Checked once, before any process is started, so a bad
`tp_size` fails with one clear message instead of a shape error inside every rank."""

from __future__ import annotations

from typing import Any, Dict, List, Protocol


class ShardedShape(Protocol):
    """What the check reads of a model's config (`minisgl.models.ModelConfig` has all of it; the
    models build on this package, so it is named here rather than imported)."""

    architecture: str
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    num_experts: int
    moe_intermediate_size: int
    raw: Dict[str, Any]


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
    has_dense = cfg.num_experts == 0 or bool(cfg.raw.get("mlp_only_layers")) or cfg.raw.get("decoder_sparse_step",
                                                                                            1) > 1
    if has_dense and cfg.intermediate_size % tp_size:
        problems.append(f"MLP width {cfg.intermediate_size} does not split over {tp_size} ranks")
    if cfg.num_experts and cfg.moe_intermediate_size % tp_size:
        problems.append(f"expert width {cfg.moe_intermediate_size} does not split over {tp_size} ranks")
    return problems


def check_tp_split(cfg: ShardedShape, tp_size: int) -> None:
    problems = tp_split_problems(cfg, tp_size)
    if problems:
        divisors = [n for n in range(1, 9) if not tp_split_problems(cfg, n)]
        raise ValueError(
            f"{cfg.architecture} cannot run with tp_size={tp_size}: {'; '.join(problems)}. "
            f"Sizes up to 8 that work for this model: {divisors}"
        )
