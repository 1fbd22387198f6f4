"""Chapter 12: a message with a tensor survives the wire format unchanged."""

import torch

from minisgl.core import SamplingParams
from minisgl.message import UserMsg, deserialize, serialize

msg = UserMsg(uid=3, input_ids=torch.tensor([5, 6, 7], dtype=torch.int32), sampling_params=SamplingParams(max_tokens=4, stop_token_ids=(2,)))
back = deserialize(serialize(msg))
assert back.uid == 3 and torch.equal(back.input_ids, msg.input_ids) and back.input_ids.dtype == torch.int32
assert back.sampling_params == msg.sampling_params
print(len(serialize(msg)), "bytes")
