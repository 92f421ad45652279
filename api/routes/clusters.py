"""/v1/clusters: what every study taught each cluster (learnt calibration, trials, held-out error, known risks)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.concurrency import run_in_threadpool

from api.deps import SettingsDep
from tuner.cluster import ClusterKey, ClusterStore, load_knowledge
from tuner.errors import TopotuneError
from tuner.hardware import get_gpu

router = APIRouter(prefix="/v1/clusters", tags=["clusters"])


def _knowledge(storage_url: str, held_out: bool) -> dict[str, Any]:
    store = ClusterStore(storage_url)
    return {"clusters": [_cluster(store, key, held_out) for key in store.clusters()]}


def _cluster(store: ClusterStore, key: ClusterKey, held_out: bool) -> dict[str, Any]:
    """One cluster as ClusterKnowledge.as_json and `error: null`; one that cannot be learnt (its GPU left the
    catalog, a row that no longer reads) is listed with what the store holds and the error, as /ui/clusters
    shows it, instead of failing the whole answer."""
    try:
        return {**load_knowledge(store, key, get_gpu(key.gpu_class), held_out=held_out).as_json(), "error": None}
    except (TopotuneError, ValueError) as exc:
        reason = exc.user_message() if isinstance(exc, TopotuneError) else str(exc).splitlines()[0]
    try:
        runs, failures = store.read_runs(key), store.read_failures(key)
        models = sorted({r.model_name for r in runs} | {f.model_name for f in failures})
        counts: dict[str, Any] = {"runs": len(runs), "models": models, "launch_failures": len(failures)}
    except (TopotuneError, ValueError):
        counts = {"runs": None, "models": [], "launch_failures": None}
    return {"cluster": key.name, "gpu_class": key.gpu_class, "interconnect": key.interconnect,
            "vllm_version": key.vllm_version, "kernel_family": key.kernel_family, **counts, "factors": {},
            "error_in_sample": {"default": None, "fitted": None}, "held_out": None, "layout_offsets": [],
            "known_risks": [], "error": f"cannot learn this cluster: {reason}"}


@router.get("")
async def list_clusters(settings: SettingsDep, held_out: Annotated[bool, Query(
        description="also score the fit leaving each model out (one more fit per model: seconds)")] = False
                        ) -> dict[str, Any]:
    """Each cluster of the study database: factors learnt against their defaults, from how many trials of which
    models, the per-layout offsets and the layout+flag combinations that crashed (`topotune calibrate` as JSON)."""
    return await run_in_threadpool(_knowledge, settings.storage_url, held_out)
