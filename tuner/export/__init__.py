"""Ready-to-run recipes for a chosen deployment: vllm command lines, a docker-compose file, an srt-slurm YAML."""

from __future__ import annotations

from typing import Literal

from tuner.deployment import Deployment
from tuner.errors import ConfigError
from tuner.export._recipes import RecipeContext, to_compose, to_srt_slurm, to_vllm_commands

ExportFormat = Literal["vllm", "compose", "srt-slurm"]
FORMATS: tuple[str, ...] = ("vllm", "compose", "srt-slurm")

__all__ = ["FORMATS", "ExportFormat", "RecipeContext", "export_deployment"]


def export_deployment(deployment: Deployment, fmt: str, context: RecipeContext) -> str:
    match fmt:
        case "vllm":
            return to_vllm_commands(deployment, context)
        case "compose":
            return to_compose(deployment, context)
        case "srt-slurm":
            return to_srt_slurm(deployment, context)
    raise ConfigError(f"unknown export format {fmt!r}", field="--format", fix=f"use one of {', '.join(FORMATS)}")
