"""A request as the replay sees it: what it asks for (`RequestSpec`) and how far it got (`EngineRequest`)."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

from tuner.replay._kvcache import CachedUnit

#: One cacheable unit of a prompt: (key, full vLLM blocks). Two prompts whose first k keys agree share k units.
Unit = tuple[Hashable, int]


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request of the stream: its lengths, its prompt's cacheable units, and when it is sent.

    `arrival_ms` is None for a request sent by a closed loop or as a later turn of a session (the replay decides
    when); `session` / `turn` tie a multi-turn conversation's requests together, `think_ms` is the pause before
    this turn once the previous answer has arrived.
    """

    prompt_tokens: int
    output_tokens: int
    units: tuple[Unit, ...] = ()
    arrival_ms: float | None = None
    session: int | None = None
    turn: int = 0
    think_ms: float = 0.0


@dataclass(slots=True, eq=False)
class EngineRequest:
    """A request inside one engine (vLLM's `Request`: num_computed_tokens, output tokens, its blocks)."""

    rid: int
    spec: RequestSpec
    sent_ms: float  # when the client sent it
    prompt_tokens: int
    output_tokens: int
    units: tuple[Unit, ...]
    computed: float = 0.0  # num_computed_tokens
    generated: float = 0.0  # output tokens so far (fractional under MTP: expected accepted tokens)
    blocks: int = 0  # blocks allocated to it (its own plus the cached units it holds)
    own_blocks: int = 0
    held: list[CachedUnit] = field(default_factory=list)
    published: int = 0  # leading units already cached by it or found cached
    published_end: int = 0  # tokens those units cover
    remote: bool = False  # PD decode side: the prompt's KV comes from a prefill instance
    hit_tokens: int = 0  # prefix-cache hit at its first admission
    queued_ms: float = 0.0  # vLLM's queued_ts: when its engine took it in (the step boundary at or after arrival)
    scheduled_ms: float | None = None  # vLLM's scheduled_ts: the start of the step that first ran it
    first_token_ms: float | None = None
    last_token_ms: float = 0.0  # its latest streamed token (a member of a DecodeSet: see Engine._write_back)
    finish_ms: float | None = None
    first_seen_ms: float | None = None  # when the front end has handed its first token on (with an output cost)
    finish_seen_ms: float | None = None  # the same for its last token
    preemptions: int = 0
    ready_ms: float = 0.0  # PD decode: when the KV transfer lands
    prefill_done_ms: float | None = None  # PD: when the prefill instance produced its token
    warmup: bool = False
    rest: tuple[RequestSpec, ...] = ()  # the session's later turns, sent once this one is answered
    instance: int = 0  # the instance the router picked
    front: EngineRequest | None = None  # PD: the prefill side of this request
    join: int = -1  # when it joined its engine's running list (that list is in join order)
    in_decode: bool = False  # a member of the engine's DecodeSet: generated, computed, blocks are held there
    g0: float = 0.0  # DecodeSet: generated = counter - g0
    g_entry: float = 0.0
    d_base: int = 0
    d_phase: float = 0.0

    @property
    def num_tokens(self) -> float:
        """vLLM's request.num_tokens: the prompt plus the tokens generated so far."""
        return self.prompt_tokens + self.generated

    @property
    def decoding(self) -> bool:
        """Only the last sampled token is left to compute: a decode step (vLLM makes no other distinction)."""
        return self.num_tokens - self.computed <= 1.0 + 1e-9
