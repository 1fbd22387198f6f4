"""Wrong: can_decode forgets that a request with no room left (remain_len == 0) cannot decode."""

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
        return not self.finished and not self.is_chunk

    def complete_one(self) -> None:
        if self.is_chunk:
            # the scheduler sets the next chunk's size; until then the rest of the prompt is pending
            self.cached_len, self.device_len = self.device_len, self.prompt_len
        else:
            self.cached_len = self.device_len
            self.device_len += 1
        self.check()
