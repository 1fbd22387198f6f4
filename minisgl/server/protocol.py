"""Request bodies of the OpenAI-compatible API, validated by pydantic (a wrong type or range is
reported with the field's name), and their translation to `SamplingParams`."""

from __future__ import annotations

from typing import Any, Dict, List, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

from minisgl.core import SamplingParams


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="ignore")  # unknown OpenAI fields are accepted and ignored

    model: str
    max_tokens: Optional[int] = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(-1, ge=-1)
    stop: Optional[Union[str, List[str]]] = None
    seed: Optional[int] = None
    ignore_eos: bool = False
    n: int = Field(1, ge=1, le=1)  # one choice per request
    stream: bool = False
    stream_options: Optional[StreamOptions] = None

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, v: int) -> int:
        if v == 0:
            raise ValueError("top_k must be -1 (off) or >= 1")
        return v

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: Optional[Union[str, List[str]]]) -> Optional[List[str]]:
        stops = [v] if isinstance(v, str) else v
        if stops is not None and (len(stops) > 4 or any(not s for s in stops)):
            raise ValueError("stop takes at most 4 non-empty strings")
        return stops

    def stop_list(self) -> List[str]:
        return list(self.stop or [])

    def limit(self) -> Optional[int]:
        return self.max_tokens

    def sampling_params(self) -> SamplingParams:
        return SamplingParams(
            max_tokens=self.limit() or 1,  # placeholder when unset: the tokenizer fills the context's room
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            seed=self.seed,
            ignore_eos=self.ignore_eos,
        )


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant"]
    content: Union[str, List[Dict[str, Any]]]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.get("text", "") for part in self.content if part.get("type") == "text")


class ChatCompletionRequest(_Common):
    messages: List[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Optional[int] = Field(None, ge=1)

    def limit(self) -> Optional[int]:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_Common):
    prompt: Union[str, List[int]]
    max_tokens: Optional[int] = Field(16, ge=1)  # the OpenAI default for completions
