"""A study point's operating point: what `topotune export STUDY` and the service's /export deploy."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuner.errors import ConfigError
from tuner.export._recipes import RecipeContext
from tuner.operating_point import OperatingPoint

if TYPE_CHECKING:
    from tuner.space import SearchSpace
    from tuner.study import CampaignResult


def campaign_operating_point(result: CampaignResult, space: SearchSpace, *, model_path: str, model_name: str,
                             point: int, study: str) -> OperatingPoint:
    """Row `point` of the composed front (else of the phase fronts) at its operating point: --max-num-seqs at the
    running requests it measured, the space's workload for the context, prefix caching and the router."""
    from tuner.study import recipe_versions

    deployments = result.exportable_deployments()
    if not 0 <= point < len(deployments):
        raise ConfigError(f"no point {point}; the front has {len(deployments)}", field="--point",
                          fix=f"use 0..{len(deployments) - 1} (see `topotune show {study}`)" if deployments else
                          "wait for the study to measure a front")
    version = recipe_versions(result)[point]
    ctx = RecipeContext.for_space(space, model_path=model_path, model_name=model_name,
                                  verified_on=version)
    return ctx.operating_point(deployments[point], source=f"study {study} point {point}")


def study_operating_point(storage_url: str, study: str, point: int) -> OperatingPoint:
    from tuner.study import load_campaign

    result, space, meta = load_campaign(storage_url, study)
    return campaign_operating_point(result, space, model_path=meta.model_path, model_name=meta.model, point=point,
                                    study=study)

