"""/metrics in the Prometheus text format."""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from api.deps import MetricsDep

router = APIRouter(tags=["metrics"])


@router.get("/metrics", response_class=Response, responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}})
def metrics(service_metrics: MetricsDep) -> Response:
    return Response(generate_latest(service_metrics.registry), media_type=CONTENT_TYPE_LATEST)
