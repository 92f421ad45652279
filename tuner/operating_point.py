"""The operating point: everything a recommendation deploys, in one typed value that survives JSON.

`topotune frontier --json` writes it (its `recommendation.operating_point`), a study point exports it, and
`topotune plan --from` / `export --from` read it back: the topology of each side (with its MTP depth,
gpu-memory-utilization, max-num-seqs and max-num-batched-tokens), prefix caching, the router's policy and why,
the served model name, the weights path, --max-model-len and the vLLM version the plan targets. Nothing on the
way from the answer to a running deployment is re-guessed.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tuner.deployment import Deployment
from tuner.errors import ConfigError, config_error
from tuner.files import read_text
from tuner.router import DeployedRouterPolicy, RouterPolicy
from tuner.workload import Workload, served_context_tokens

# Below this share of input tokens re-sent as a prefix, keeping prefixes on one replica buys little: round robin.
PREFIX_AWARE_MIN_REUSE = 0.05
# A `frontier --json` file: 145 KB for the reference model on 72 GPUs; a budget of thousands stays far below this.
MAX_POINT_FILE_BYTES = 64 * 2**20


class RouterChoice(BaseModel):
    """The router's policy and the reason, in words (printed with every plan)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # vllm-router's `--policy` (tuner/router.py); the older hyphenated spelling is read too
    policy: DeployedRouterPolicy = RouterPolicy.ROUND_ROBIN
    reason: str = "no workload given: requests are spread evenly"


def choose_router_policy(traffic: Workload | None) -> RouterChoice:
    """Prefix-aware (cache_aware) when the traffic re-sends prefixes, round robin otherwise.

    Round robin scatters the requests of one prefix over every replica, so each replica caches (and prefills)
    every prefix; cache_aware sends a prefix to the replica that already holds it, so the replicas' caches add up
    (Workload.prefix_hit_share models both).
    """
    if traffic is None:
        return RouterChoice()
    if traffic.trace is not None:
        reuse = traffic.trace.prefix_reuse
        if reuse >= PREFIX_AWARE_MIN_REUSE:
            return RouterChoice(policy=RouterPolicy.CACHE_AWARE, reason=(
                f"the trace re-sends {reuse:.0%} of its input tokens as shared prefixes: cache_aware sends a "
                "request to the replica that already caches its prefix (round robin would make every replica "
                "cache and prefill every prefix)"))
        return RouterChoice(reason=f"the trace shares almost no prefixes ({reuse:.1%} of input tokens): round "
                                   "robin spreads the load evenly")
    if traffic.prefix is not None:
        p = traffic.prefix
        return RouterChoice(policy=RouterPolicy.CACHE_AWARE, reason=(
            f"every prompt starts with one of {p.num_prefixes} shared prefix(es) of {p.shared_tokens:,} tokens: "
            "cache_aware keeps each prefix on the replica that caches it"))
    return RouterChoice(reason="the workload shares no prefixes: round robin spreads the load evenly")


class ContextLimit(BaseModel):
    """--max-model-len for a workload on a model: the longest request with headroom, capped at the model's
    context; `refused_share` is the share of requests longer than that (vLLM rejects them)."""

    model_config = ConfigDict(frozen=True)

    max_model_len: int
    model_max_len: int | None
    refused_share: float = 0.0
    refused_requests: int | None = None  # counted in the trace file when it is readable

    def warning(self) -> str | None:
        if not self.refused_share and not self.refused_requests:
            return None
        count = f"{self.refused_requests} request(s)" if self.refused_requests else \
            f"about {self.refused_share:.1%} of requests"
        return (f"{count} need more than --max-model-len {self.max_model_len:,} tokens (the model's context is "
                f"{self.model_max_len:,}): vLLM refuses them with HTTP 400")


def context_limit(traffic: Workload, model_max_len: int | None) -> ContextLimit:
    """The served context for `traffic`: the longest request (input + output) plus headroom, at most the
    model's own context (max_position_embeddings); the requests that would not fit are counted."""
    wanted = served_context_tokens(*traffic.longest_request_tokens)
    if model_max_len is None or wanted <= model_max_len:
        return ContextLimit(max_model_len=wanted, model_max_len=model_max_len)
    refused: int | None = None
    share = 0.0
    trace = traffic.trace
    if trace is not None and Path(trace.path).is_file():
        from tuner.workload import read_trace

        refused = sum(1 for r in read_trace(trace.path) if r.input_tokens + r.output_tokens > model_max_len)
        share = refused / trace.requests
    else:  # a length distribution: the share of prompts alone past the context, from its quantiles
        quantiles = [traffic.input_tokens.quantile(q / 100) + traffic.output_tokens.expected for q in range(101)]
        share = sum(1 for t in quantiles if t > model_max_len) / 101
    return ContextLimit(max_model_len=model_max_len, model_max_len=model_max_len, refused_share=share,
                        refused_requests=refused)


class OperatingPoint(BaseModel):
    """What one recommendation deploys. The deployment's topologies carry each side's MTP depth,
    gpu-memory-utilization, max-num-seqs (the batch that holds the SLA) and max-num-batched-tokens."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    deployment: Deployment
    model_path: str = Field(description="The weights as vLLM loads them (a path on the hosts, or a hub id).")
    served_model_name: str = Field("model", min_length=1)
    gpu: str
    gpus_per_host: int = Field(ge=1)
    max_model_len: int | None = Field(None, ge=1)
    # True: --enable-prefix-caching (the traffic re-sends prefixes); False: --no-enable-prefix-caching; None:
    # vLLM's own default.
    prefix_caching: bool | None = None
    router: RouterChoice = RouterChoice()
    vllm_version: str | None = Field(None, description="The vLLM the plan targets (None: the newest checked).")
    # The benchmark a recipe runs: the workload's typical request (mean input and output tokens), not its maxima.
    typical_isl: int = Field(ge=1)
    typical_osl: int = Field(ge=1)
    concurrency: tuple[int, ...] = ()
    source: str = Field("", description="Where the point comes from: 'frontier', 'study NAME point 0'.")
    measured_on: str | None = Field(None, description="What its figures rest on: 'simulated (vLLM 0.32 rules)', "
                                                      "'vLLM 0.32.0 · model e0f1e04' (None: not recorded).")

    def as_json(self) -> dict[str, object]:
        return self.model_dump(mode="json")

    @classmethod
    def from_json(cls, data: object, *, where: str = "operating_point") -> OperatingPoint:
        """Read one back; a missing or bad field is a ConfigError naming it."""
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise config_error(exc, where, fix="write it with `topotune frontier --json` (or `topotune export "
                                               "--format point`), not by hand") from exc

    def with_running_requests(self, running_requests: float) -> OperatingPoint:
        """The decode (or aggregated) side capped at `running_requests` per instance, spread over its DP ranks:
        vLLM then admits no more than the batch that holds the SLA."""
        return self.model_copy(update={"deployment": at_running_requests(self.deployment, running_requests)})


def at_running_requests(deployment: Deployment, running_requests: float) -> Deployment:
    """The deployment with the decode (or aggregated) side's --max-num-seqs at `running_requests` per instance,
    per DP rank (never above the trial's own)."""
    from tuner.topology import Role

    serving = deployment.group(Role.DECODE) or deployment.group(Role.BOTH)
    if serving is None:
        return deployment
    topo = serving.topology
    per_rank = max(1, math.ceil(running_requests / topo.dp - 1e-9))
    return deployment.with_decode_seqs(min(topo.max_num_seqs, per_rank))


def read_operating_point(path: Path, point: int | None = None) -> OperatingPoint:
    """The operating point of a `topotune frontier --json` file (its recommendation, or row `point` of its
    fronts: the PD front first, then the aggregated one, as the JSON lists them), or of an exported point file."""
    text = read_text(path, max_bytes=MAX_POINT_FILE_BYTES, field="--from", what="a `topotune frontier --json` file",
                     fix="give the file `topotune frontier --json > FILE` wrote")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not JSON ({exc.msg}, line {exc.lineno})", field="--from",
                          fix="give the file `topotune frontier --json > FILE` wrote") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path} holds no JSON object", field="--from", fix="give a `frontier --json` file")
    if "deployment" in data and "model_path" in data:  # an operating point on its own
        if point:
            raise ConfigError(f"{path} holds one operating point", field="--point", fix="drop --point")
        return OperatingPoint.from_json(data, where=str(path))
    rows = [*data.get("front", []), *data.get("aggregated_front", [])]
    if point is None:
        rec = data.get("recommendation") or {}
        if not isinstance(rec, dict) or "operating_point" not in rec:
            raise ConfigError(f"{path} has no recommendation.operating_point", field="--from",
                              fix="write it again with this topotune's `frontier --json` (older files lack it)")
        if rec["operating_point"] is None:
            raise ConfigError(f"{path}: no deployment met the limits, so there is nothing to deploy",
                              field="--from", fix="relax the limits of the frontier run")
        return OperatingPoint.from_json(rec["operating_point"], where=f"{path}: recommendation.operating_point")
    if not 0 <= point < len(rows):
        raise ConfigError(f"no point {point}; {path} lists {len(rows)} (front, then aggregated_front)",
                          field="--point", fix=f"use 0..{len(rows) - 1}" if rows else "drop --point")
    row = rows[point]
    if not isinstance(row, dict) or "operating_point" not in row:
        raise ConfigError(f"{path}: point {point} has no operating_point", field="--point",
                          fix="write the file again with this topotune's `frontier --json`")
    return OperatingPoint.from_json(row["operating_point"], where=f"{path}: point {point}")
