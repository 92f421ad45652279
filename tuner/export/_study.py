"""A study point's operating point: what `topotune export STUDY` and the service's /export deploy."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from tuner.errors import ConfigError
from tuner.export._recipes import RecipeContext
from tuner.operating_point import OperatingPoint

if TYPE_CHECKING:
    from tuner.space import SearchSpace
    from tuner.study import CampaignResult


def campaign_operating_point(result: CampaignResult, space: SearchSpace, *, model_path: str, model_name: str,
                             point: int, study: str, backend: str, instead: str | None = None) -> OperatingPoint:
    """Row `point` of the composed front (else of the phase fronts) at its operating point: --max-num-seqs at the
    running requests it measured, the space's workload for the context, prefix caching and the router.

    A PD campaign exports its composed front (CampaignResult.exports_composed, the one rule): without one, the
    refusal says why, with the composition's fix and what the face offers instead (`instead`; by default exporting
    one phase's instances, `study` as STUDY/PHASE)."""
    from tuner.study import recipe_versions

    deployments = result.exportable_deployments()
    if result.exports_composed and not result.composed_front:
        why = result.composition_refusal
        instead = instead or f"export one phase's instances instead: the `study` {study}/decode or /prefill"
        raise ConfigError("no composed PD front to export" + (f": {why.message}" if why else ""), field="point",
                          fix=f"{why.fix} to compose one, or {instead}" if why and why.fix else instead)
    if not 0 <= point < len(deployments):
        raise ConfigError(f"no point {point}; the front has {len(deployments)}", field="point",
                          fix=f"use 0..{len(deployments) - 1} (see `topotune show {study}`)" if deployments else
                          "wait for the study to measure a front")
    version = recipe_versions(result)[point]
    if backend == "simulated":  # nothing ran: the figures are the simulator's under that version's rules
        version = simulated_label(version)
    ctx = RecipeContext.for_space(space, model_path=model_path, model_name=model_name,
                                  verified_on=version)
    if result.composed_front:
        chosen = result.composed_front[point]
        clients = chosen.num_decode * chosen.decode.concurrency
    else:
        clients = [p for pr in result.phases.values() for p in pr.front][point].metrics.concurrency
    return ctx.operating_point(deployments[point], source=f"study {study} point {point}", concurrency=(clients,))


def study_operating_point(storage_url: str, study: str, point: int) -> OperatingPoint:
    from tuner.study import load_campaign

    result, space, meta = load_campaign(storage_url, study)
    return campaign_operating_point(result, space, model_path=meta.model_path, model_name=meta.model, point=point,
                                    study=study, backend=meta.backend)


def simulated_label(version_label: str) -> str:
    """'vLLM 0.32.0 · model e0f1e04' of a simulated trial -> 'simulated (vLLM 0.32 rules)'; a composed point whose
    sides ran under different versions (one re-verified since: 'prefill vLLM 0.32.0 · ..., decode vLLM 0.33.0
    · ...') names each side's, not the first one found."""
    found = re.findall(r"(?:(prefill|decode) )?vLLM (\d+)\.(\d+)", version_label)
    if not found:
        return "simulated"
    if len({(major, minor) for _, major, minor in found}) == 1:
        return f"simulated (vLLM {found[0][1]}.{found[0][2]} rules)"
    return "simulated (" + ", ".join(f"{side} vLLM {major}.{minor} rules".lstrip()
                                     for side, major, minor in found) + ")"

