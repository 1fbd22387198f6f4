"""Exercise req-lengths (chapter 1): the request ledger.

Write the derived lengths of `Req` and `complete_one`. Everything else about `Req` (its fields,
`__post_init__`, `check`, `append_host`) is the engine's. Grade with `python judge.py req-lengths`.
"""

from minisgl.core import Req as EngineReq


class Req(EngineReq):
    @property
    def extend_len(self) -> int:
        """Tokens the next forward pass computes: positions [cached_len, device_len)."""
        raise NotImplementedError("req-lengths: write Req.extend_len")

    @property
    def remain_len(self) -> int:
        """Tokens this request may still generate after the pending pass."""
        raise NotImplementedError("req-lengths: write Req.remain_len")

    @property
    def is_chunk(self) -> bool:
        """True while the pending pass covers only part of the prompt (its sampled token is thrown away)."""
        raise NotImplementedError("req-lengths: write Req.is_chunk")

    @property
    def can_decode(self) -> bool:
        """True if the request can take part in a decode step."""
        raise NotImplementedError("req-lengths: write Req.can_decode")

    def complete_one(self) -> None:
        """The forward pass for [cached_len, device_len) was launched: move the lengths on."""
        raise NotImplementedError("req-lengths: write Req.complete_one")
