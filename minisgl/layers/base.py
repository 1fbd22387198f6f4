"""`BaseOP`: a layer without `nn.Module`. It finds its own weights by walking its attributes.

Inference needs no autograd, hooks or buffers, only named tensors that a loader can fill. Public
tensor attributes are weights; public `BaseOP` / `OPList` attributes are children; anything whose
name starts with `_` is private state (caches, tied references) and is not part of the state dict.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Sequence

import torch


class BaseOP:
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def named_children(self) -> Iterator[tuple[str, "BaseOP"]]:
        for name, value in vars(self).items():
            if not name.startswith("_") and isinstance(value, BaseOP):
                yield name, value

    def state_dict(self, prefix: str = "") -> Dict[str, torch.Tensor]:
        """Every weight under this op, keyed by dotted name (the checkpoint's naming)."""
        result: Dict[str, torch.Tensor] = {}
        for name, value in vars(self).items():
            if name.startswith("_"):
                continue
            if isinstance(value, torch.Tensor):
                result[prefix + name] = value
            elif isinstance(value, BaseOP):
                result.update(value.state_dict(f"{prefix}{name}."))
        return result

    def load_state_dict(self, state: Dict[str, torch.Tensor], strict: bool = True) -> None:
        """Copy tensors into this op's weights in place (shapes must match exactly)."""
        own = self.state_dict()
        if strict:
            missing = sorted(set(own) - set(state))
            unexpected = sorted(set(state) - set(own))
            if missing or unexpected:
                raise KeyError(f"state dict mismatch: missing={missing[:5]}, unexpected={unexpected[:5]}")
        for name, tensor in state.items():
            if name not in own:
                continue
            target = own[name]
            if target.shape != tensor.shape:
                raise ValueError(f"{name}: expected shape {tuple(target.shape)}, got {tuple(tensor.shape)}")
            target.copy_(tensor)


class OPList(BaseOP):
    """An indexable list of ops whose weights are named `0.`, `1.`, ..."""

    def __init__(self, ops: Sequence[BaseOP]) -> None:
        self.ops: List[BaseOP] = list(ops)

    def __len__(self) -> int:
        return len(self.ops)

    def __iter__(self) -> Iterator[BaseOP]:
        return iter(self.ops)

    def __getitem__(self, i: int) -> BaseOP:
        return self.ops[i]

    def named_children(self) -> Iterator[tuple[str, BaseOP]]:
        for i, op in enumerate(self.ops):
            yield str(i), op

    def state_dict(self, prefix: str = "") -> Dict[str, torch.Tensor]:
        result: Dict[str, torch.Tensor] = {}
        for i, op in enumerate(self.ops):
            result.update(op.state_dict(f"{prefix}{i}."))
        return result


def empty_weight(*shape: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Weights start uninitialised: the loader (or the dummy initialiser) always fills them."""
    return torch.empty(*shape, dtype=dtype, device=device)
