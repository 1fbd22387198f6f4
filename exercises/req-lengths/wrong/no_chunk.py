"""Wrong: complete_one ignores chunked prefill and always steps one token on."""

from minisgl.core import Req as EngineReq


class Req(EngineReq):
    @property
    def extend_len(self) -> int:
        return self.device_len - self.cached_len

    @property
    def remain_len(self) -> int:
        return self.max_device_len - self.device_len

    @property
    def is_chunk(self) -> bool:
        return self.device_len < self.prompt_len

    @property
    def can_decode(self) -> bool:
        return not self.finished and not self.is_chunk and self.remain_len > 0

    def complete_one(self) -> None:
        self.cached_len = self.device_len
        self.device_len += 1
        self.check()
