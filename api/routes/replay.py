"""/v1/replay: a request stream through one deployment, request by request (the library's `replay_stream`)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from api.deps import Authorized, SettingsDep
from api.replay import replay_answer
from api.schemas import ReplayCreate

router = APIRouter(prefix="/v1/replay", tags=["replay"])


@router.post("", dependencies=[Authorized])
def create_replay(body: ReplayCreate, settings: SettingsDep) -> dict[str, Any]:
    """Per-request TTFT, ITL and end-to-end latency with their percentiles, throughput, goodput under the SLA,
    prefix hits, preemptions and the queue/KV timeline: the object `topotune replay --json` prints (same keys).
    No trial runs: a replay of thousands of requests answers in about a second."""
    return replay_answer(body, settings)
