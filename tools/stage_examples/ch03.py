"""Chapter 3: build tiny-llama from its config and stream its checkpoint in."""

import torch
from safetensors.torch import load_file

from minisgl.models import ModelConfig, create_model, load_checkpoint

path = "models/tiny-llama"
cfg = ModelConfig.from_dir(path)
model = create_model(cfg, torch.float32, torch.device("cpu"))
load_checkpoint(model, path)
ckpt = load_file(f"{path}/model.safetensors")
qkv = model.state_dict()["model.layers.0.self_attn.qkv_proj.weight"]
q = ckpt["model.layers.0.self_attn.q_proj.weight"]
assert torch.equal(qkv[: q.shape[0]], q)
print(cfg.architecture, len(model.state_dict()), "weights")
