"""Ready-to-run recipes for a chosen deployment: vllm command lines, a docker-compose file, an srt-slurm YAML."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from tuner.deployment import Deployment
from tuner.errors import ConfigError
from tuner.export._kubernetes import dynamo_object, kubernetes_objects, to_dynamo, to_kubernetes
from tuner.export._recipes import RecipeContext, router_lines, to_compose, to_srt_slurm, to_vllm_commands
from tuner.export._study import campaign_operating_point, simulated_label, study_operating_point
from tuner.operating_point import OperatingPoint

ExportFormat = Literal["vllm", "compose", "kubernetes", "dynamo", "srt-slurm"]
FORMATS: tuple[str, ...] = ("vllm", "compose", "kubernetes", "dynamo", "srt-slurm")

if TYPE_CHECKING:
    from tuner.models import ModelSpec

__all__ = ["FORMATS", "ExportFormat", "RecipeContext", "campaign_operating_point", "dynamo_object", "export_deployment",
           "export_point", "kubernetes_objects", "router_lines", "simulated_label", "study_operating_point"]


def export_deployment(deployment: Deployment, fmt: str, context: RecipeContext) -> str:
    match fmt:
        case "vllm":
            return to_vllm_commands(deployment, context)
        case "compose":
            return to_compose(deployment, context)
        case "srt-slurm":
            return to_srt_slurm(deployment, context)
        case "kubernetes":
            return to_kubernetes(deployment, context)
        case "dynamo":
            return to_dynamo(deployment, context)
    raise ConfigError(f"unknown export format {fmt!r}", field="--format", fix=f"use one of {', '.join(FORMATS)}")


def export_point(point: OperatingPoint, fmt: str, *, model: ModelSpec | None = None) -> str:
    """A recipe of an operating point: its deployment with everything else it carries."""
    return export_deployment(point.deployment, fmt, RecipeContext.of_point(point, model=model))
