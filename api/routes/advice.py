"""/v1/advice: "what should I deploy?" for a model, hardware, traffic and SLA (the library's `advise`)."""

from __future__ import annotations

from fastapi import APIRouter

from api.advice import answer
from api.deps import Authorized, SettingsDep
from api.schemas import AdviceCreate, AdvicePublic

router = APIRouter(prefix="/v1/advice", tags=["advice"])


@router.post("", dependencies=[Authorized])
def create_advice(body: AdviceCreate, settings: SettingsDep) -> AdvicePublic:
    """Both fronts from the performance model, the recommendation under the SLA (the `recommendation` object of
    `topotune frontier --json`, same keys), why, and the winner's `vllm serve` commands. No trial runs: it
    answers in about a second."""
    return answer(body, settings)[1]
