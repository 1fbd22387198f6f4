"""A complete answer to base-op (the engine's own logic)."""

from typing import Dict

import torch

from minisgl.layers.base import BaseOP as EngineBaseOP


class BaseOP(EngineBaseOP):
    def state_dict(self, prefix: str = "") -> Dict[str, torch.Tensor]:
        result: Dict[str, torch.Tensor] = {}
        for name, value in vars(self).items():
            if name.startswith("_"):
                continue  # private state: caches, tied references
            if isinstance(value, torch.Tensor):
                result[prefix + name] = value
            elif isinstance(value, EngineBaseOP):
                result.update(value.state_dict(f"{prefix}{name}."))
        return result
