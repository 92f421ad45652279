"""The traffic a trial measures: token lengths and the concurrency levels of the sweep."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator


class Workload(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    isl: int = Field(8192, ge=1, description="input tokens per request")
    osl: int = Field(1024, ge=1, description="output tokens per request")
    concurrency: tuple[int, ...] = Field((1, 8, 64, 256), min_length=1)
    requests_per_level: int = Field(0, ge=0, description="0 = max(2 x concurrency, 16)")

    @field_validator("concurrency")
    @classmethod
    def _positive_sorted(cls, levels: tuple[int, ...]) -> tuple[int, ...]:
        if any(c < 1 for c in levels):
            raise ValueError("concurrency levels must be >= 1")
        return tuple(sorted(set(levels)))

    def request_count(self, concurrency: int) -> int:
        return self.requests_per_level or max(2 * concurrency, 16)


def served_context_tokens(isl: int, osl: int) -> int:
    """--max-model-len for a workload: isl + osl plus headroom (5%, at least 256 tokens, rounded up to 256).

    AIPerf's synthetic prompts are built to isl tokens with one tokenizer and re-tokenized by the server, which
    can count a few more; a context of exactly isl + osl rejects those requests. The recipes leave headroom
    too. The memory model reads the same figure (vLLM refuses to start when one max-model-len request does not
    fit the KV cache).
    """
    tokens = isl + osl
    return -(-(tokens + max(256, -(-tokens // 20))) // 256) * 256
