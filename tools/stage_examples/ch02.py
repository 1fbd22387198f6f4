"""Chapter 2: layers without nn.Module match their torch counterparts."""

import torch

from minisgl.layers.linear import LinearReplicated
from minisgl.layers.norm import RMSNorm

torch.manual_seed(0)
lin = LinearReplicated(8, 4, bias=True, dtype=torch.float32, device=torch.device("cpu"))
ref = torch.nn.Linear(8, 4)
lin.load_state_dict({k: v.detach() for k, v in ref.state_dict().items()})
x = torch.randn(3, 8)
assert torch.allclose(lin(x), ref(x))
norm = RMSNorm(8, 1e-6, dtype=torch.float32, device=torch.device("cpu"))
norm.weight.fill_(1.0)
assert torch.allclose(norm(x), torch.nn.functional.rms_norm(x, (8,), eps=1e-6), atol=1e-6)
print(sorted(lin.state_dict()))
