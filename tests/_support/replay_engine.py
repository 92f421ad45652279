"""Drive one replay engine over timed requests, as the replay's event loop does, for tests that compare two engines
(closed-form stretches against step by step) on the same arrivals."""

from __future__ import annotations

from tuner.replay import Engine
from tuner.replay._requests import EngineRequest, RequestSpec


class StepByStep(Engine):
    """No closed-form stretch: every decode step is taken alone (the reference a stretch must match)."""

    def _stretch_length(self, limit_ms: float) -> int:
        return 0


class LinearStep:
    """A step of 1 ms plus `slope` ms per token of mean decode context: linear, so a stretch prices it exactly."""

    accepted = 1.0

    def __init__(self, slope: float) -> None:
        self.slope = slope

    def step_ms(self, decode_requests: float, decode_context: float, *_: float) -> float:
        return 1.0 + self.slope * decode_context


def drive(engine: Engine, timed: list[tuple[RequestSpec, int]]) -> list[EngineRequest]:
    """Each spec reaches the engine at its time (ms, ascending); advance until every request has finished."""
    pending = list(timed)
    requests: list[EngineRequest] = []
    while pending or engine.has_work:
        while pending and pending[0][1] <= engine.clock + 1e-9:
            spec, arrive = pending.pop(0)
            r = EngineRequest(rid=len(requests), spec=spec, sent_ms=arrive, prompt_tokens=spec.prompt_tokens,
                              output_tokens=spec.output_tokens, units=spec.units)
            requests.append(r)
            engine.add(r, float(arrive))
        if not engine.has_work:
            engine.clock = float(pending[0][1])
            continue
        engine.advance(pending[0][1] if pending else float("inf"))
    return requests
