"""Cases for base-op: state dicts of real layers and models; a model loaded through them."""

import random

import torch

from judge import harness
from judge.api import E2E, Obs, case
from minisgl.core import SamplingParams
from minisgl.layers.base import BaseOP, OPList
from minisgl.layers.linear import LinearReplicated
from minisgl.layers.norm import RMSNorm

CPU = dict(dtype=torch.float32, device=torch.device("cpu"))


def _record(obs: Obs, op: BaseOP, prefix: str = "") -> None:
    sd = op.state_dict(prefix) if prefix else op.state_dict()
    obs.eq("weight names (sorted)", sorted(sd))
    obs.eq("weight shapes by name", {k: list(v.shape) for k, v in sorted(sd.items())})
    own = _walk(op, prefix)
    obs.eq("each weight is the layer's own tensor (not a copy)", {k: (sd[k] is own[k]) if k in own else "unknown name" for k in sorted(sd)})


def _walk(op, prefix=""):
    """The tensors reachable through public attributes, found without calling state_dict."""
    out = {}
    items = [(str(i), o) for i, o in enumerate(op.ops)] if isinstance(op, OPList) else [(k, v) for k, v in vars(op).items() if not k.startswith("_")]
    for k, v in items:
        if isinstance(v, torch.Tensor):
            out[prefix + k] = v
        elif isinstance(v, BaseOP):
            out.update(_walk(v, f"{prefix}{k}."))
    return out


class Block(BaseOP):
    def __init__(self, width: int, bias: bool) -> None:
        self.norm = RMSNorm(width, 1e-6, **CPU)
        self.proj = LinearReplicated(width, 2 * width, bias=bias, **CPU)
        self.scale = torch.ones(width)
        self._cache = torch.zeros(3)  # private: not a weight
        self._twin = self.proj  # private: a second path to the same op
        self.width = width  # not a tensor


class Net(BaseOP):
    def __init__(self, depth: int, width: int) -> None:
        self.blocks = OPList([Block(width, bias=i % 2 == 0) for i in range(depth)])
        self.head = LinearReplicated(width, 7, **CPU)
        self._note = "private"


@case("one linear layer", hint=1)
def linear(obs: Obs) -> None:
    _record(obs, LinearReplicated(4, 3, bias=True, **CPU))


@case("a block with children, a plain tensor and private attributes", hint=2)
def block(obs: Obs) -> None:
    _record(obs, Block(8, bias=True))


@case("a network with an OPList of blocks, under a prefix", hint=3)
def net(obs: Obs) -> None:
    _record(obs, Net(3, 4), prefix="model.")


@case("random networks", seeds=3, hint=3)
def random_nets(obs: Obs, seed: int) -> None:
    rng = random.Random(seed)
    _record(obs, Net(rng.randint(0, 5), rng.choice([2, 4, 6])), prefix=rng.choice(["", "model.", "a.b."]))


@case("the tiny Qwen3 model's state dict (tied LM head)", hint=2)
def model(obs: Obs) -> None:
    from minisgl.models import ModelConfig, create_model

    cfg = ModelConfig.from_dir(harness.model_path("tiny-qwen3"))
    _record(obs, create_model(cfg, torch.float32, torch.device("cpu")))


@case("tiny-qwen3 and tiny-llama load through your state_dict and generate", kind=E2E, hint=2)
def engine(obs: Obs) -> None:
    prompts = harness.random_prompts(seed=2, n=3, lo=3, hi=10)
    for name in ("tiny-qwen3", "tiny-llama"):
        obs.eq("model", name)
        harness.generate(obs, harness.scheduler_config(name), prompts, SamplingParams(max_tokens=5, ignore_eos=True), trace=False)
