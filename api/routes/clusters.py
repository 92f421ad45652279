"""/v1/clusters: what every study taught each cluster (learnt calibration, trials, held-out error, known risks)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.concurrency import run_in_threadpool

from api.cluster_view import learnt
from api.deps import SettingsDep
from tuner.cluster import ClusterKey, ClusterStore
from tuner.errors import TopotuneError

router = APIRouter(prefix="/v1/clusters", tags=["clusters"])


def _knowledge(storage_url: str, held_out: bool) -> dict[str, Any]:
    out = []
    for key, knowledge in learnt(storage_url, held_out=held_out):  # refitted only when the store changed
        out.append({**knowledge.as_json(), "error": None} if not isinstance(knowledge, TopotuneError)
                   else _unlearnt(ClusterStore(storage_url), key, knowledge.user_message()))
    return {"clusters": out}


def _unlearnt(store: ClusterStore, key: ClusterKey, reason: str) -> dict[str, Any]:
    """A cluster that cannot be learnt (its GPU left the catalog, a row that no longer reads) is listed with what
    the store holds and the error, as /ui/clusters shows it, instead of failing the whole answer."""
    try:
        runs, failures = store.read_runs(key), store.read_failures(key)
        models = sorted({r.model_name for r in runs} | {f.model_name for f in failures})
        counts: dict[str, Any] = {"runs": len(runs), "models": models, "launch_failures": len(failures)}
    except (TopotuneError, ValueError):
        counts = {"runs": None, "models": [], "launch_failures": None}
    return {"cluster": key.name, "gpu_class": key.gpu_class, "interconnect": key.interconnect,
            "vllm_version": key.vllm_version, "kernel_family": key.kernel_family, **counts, "factors": {},
            "error_in_sample": {"default": None, "fitted": None}, "held_out": None, "layout_offsets": [],
            "known_risks": [], "kernel_factors": [], "kernel_kind": None, "guards": [], "pretrial_checks": [],
            "error": f"cannot learn this cluster: {reason}"}


@router.get("")
async def list_clusters(settings: SettingsDep, held_out: Annotated[bool, Query(
        description="also score the fit leaving each model out (one more fit per model: seconds)")] = False
                        ) -> dict[str, Any]:
    """Each cluster of the study database: factors learnt against their defaults, from how many trials of which
    models, the per-layout offsets and the layout+flag combinations that crashed (`topotune calibrate` as JSON)."""
    return await run_in_threadpool(_knowledge, settings.storage_url, held_out)
