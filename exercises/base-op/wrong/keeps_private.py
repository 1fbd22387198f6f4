"""Wrong: private attributes are collected too, so a tied LM head shows up twice."""

from typing import Dict

import torch

from minisgl.layers.base import BaseOP as EngineBaseOP


class BaseOP(EngineBaseOP):
    def state_dict(self, prefix: str = "") -> Dict[str, torch.Tensor]:
        result: Dict[str, torch.Tensor] = {}
        for name, value in vars(self).items():
            if isinstance(value, torch.Tensor):
                result[prefix + name] = value
            elif isinstance(value, EngineBaseOP):
                result.update(value.state_dict(f"{prefix}{name}."))
        return result
