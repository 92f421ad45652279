"""/v1/clusters: what every study taught each cluster (learnt calibration, trials, held-out error, known risks)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.concurrency import run_in_threadpool

from api.cluster_view import learnt
from api.deps import SettingsDep
from tuner.errors import TopotuneError

router = APIRouter(prefix="/v1/clusters", tags=["clusters"])


def _knowledge(storage_url: str, held_out: bool) -> dict[str, Any]:
    out = []
    for _key, knowledge in learnt(storage_url, held_out=held_out):  # refitted only when the store changed
        if isinstance(knowledge, TopotuneError):
            raise knowledge
        out.append(knowledge.as_json())
    return {"clusters": out}


@router.get("")
async def list_clusters(settings: SettingsDep, held_out: Annotated[bool, Query(
        description="also score the fit leaving each model out (one more fit per model: seconds)")] = False
                        ) -> dict[str, Any]:
    """Each cluster of the study database: factors learnt against their defaults, from how many trials of which
    models, the per-layout offsets and the layout+flag combinations that crashed (`topotune calibrate` as JSON)."""
    return await run_in_threadpool(_knowledge, settings.storage_url, held_out)
