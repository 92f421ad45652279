"""The three recipe renderers share one launch plan (tuner.backends.vllm.build_plan): what a trial ran is
exactly what a recipe runs."""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from tuner.backends.vllm import (
    LaunchPlan,
    build_plan,
    keep_names,
    model_or_none,
    pack_hosts,
    point_plan_settings,
)
from tuner.deployment import Deployment
from tuner.hardware import get_gpu
from tuner.operating_point import OperatingPoint, RouterChoice, choose_router_policy, context_limit
from tuner.topology import Role
from tuner.workload import Workload, served_context_tokens

if TYPE_CHECKING:  # the space's module (and its validators) loads only where a study uses it
    from tuner.models import ModelSpec
    from tuner.space import SearchSpace

VLLM_IMAGE_REPO = "vllm/vllm-openai"
CONTAINER_MODELS_DIR = "/models"


class _PlainDumper(yaml.SafeDumper):
    """YAML without anchors and aliases (a reader sees every value where it applies)."""

    def ignore_aliases(self, data: object) -> bool:
        return True


def dump_yaml(data: object) -> str:
    return yaml.dump(data, Dumper=_PlainDumper, sort_keys=False)


def dump_yaml_all(documents: list) -> str:
    return yaml.dump_all(documents, Dumper=_PlainDumper, sort_keys=False)


def vllm_image(version: str | None) -> str:
    """The vLLM image of the version a plan targets (vllm/vllm-openai tags releases `vX.Y.Z`), never `:latest`."""
    from tuner.backends.vllm import NEWEST_CHECKED

    return f"{VLLM_IMAGE_REPO}:v{version or NEWEST_CHECKED}"


def is_local_path(model_path: str) -> bool:
    """A weights folder (mounted into containers) rather than a hub id (which vLLM downloads)."""
    return model_path.startswith(("/", ".", "~")) or Path(model_path).exists()


def absolute_model_path(model_path: str) -> str:
    """A local weights folder as an absolute path, so a recipe works from any directory (a hub id as it is)."""
    path = Path(model_path).expanduser()
    return str(path.resolve()) if path.exists() else model_path


@dataclass(frozen=True)
class RecipeContext:
    """Everything a recipe needs besides the deployment: an operating point without its deployment."""

    model_path: str
    model_name: str  # --served-model-name
    gpu: str
    gpus_per_host: int
    isl: int  # the workload's typical request (mean input/output tokens): the benchmark a recipe runs
    osl: int
    concurrency: tuple[int, ...] = ()
    precision: str = "bf16"
    vllm_version: str | None = None  # the version the plan targets: the version table's choices and the image
    prefix_caching: bool | None = None  # True: --enable-prefix-caching; False: off; None: vLLM's default
    max_model_len: int | None = None  # None: the typical request with headroom (served_context_tokens)
    router: RouterChoice = field(default_factory=RouterChoice)
    # what the recipe's measurements ran on, e.g. "vLLM 0.32.0 · model e0f1e04" (tuner.study.recipe_versions), or
    # "simulated (vLLM 0.32 rules)": every format names it, so a recipe says what its figures rest on
    verified_on: str | None = None
    # the model at model_path when the caller has read it already (`topotune frontier`): None reads it once here
    model: ModelSpec | None = field(default=None, compare=False, repr=False)

    @cached_property
    def model_spec(self) -> ModelSpec | None:
        """The model the plan checks (hybrid PD settings, pairing), None when its config cannot be read."""
        return self.model if self.model is not None else model_or_none(self.model_path)

    @property
    def image(self) -> str:
        return vllm_image(self.vllm_version)

    def verified_line(self) -> str:
        if not self.verified_on:
            return "# Measured on: not recorded (a study stored before versions were kept)."
        if self.verified_on.startswith("vLLM"):  # measured
            return f"# Verified on {self.verified_on}."
        return f"# Figures: {self.verified_on}, not measured."

    def operating_point(self, deployment: Deployment, source: str = "",
                        concurrency: tuple[int, ...] | None = None) -> OperatingPoint:
        """The point of `deployment` in this context (`concurrency`: the clients its benchmark runs, default the
        context's)."""
        return OperatingPoint(
            deployment=deployment, model_path=self.model_path, served_model_name=self.model_name, gpu=self.gpu,
            gpus_per_host=self.gpus_per_host, max_model_len=self.max_model_len or served_context_tokens(
                self.isl, self.osl), prefix_caching=self.prefix_caching, router=self.router,
            vllm_version=self.vllm_version, typical_isl=self.isl, typical_osl=self.osl,
            concurrency=self.concurrency if concurrency is None else concurrency, source=source,
            measured_on=self.verified_on)

    @classmethod
    def of_point(cls, point: OperatingPoint, *, model: ModelSpec | None = None) -> RecipeContext:
        return cls(model_path=point.model_path, model_name=point.served_model_name, gpu=point.gpu,
                   gpus_per_host=point.gpus_per_host, isl=point.typical_isl, osl=point.typical_osl,
                   concurrency=point.concurrency, vllm_version=point.vllm_version,
                   prefix_caching=point.prefix_caching, max_model_len=point.max_model_len, router=point.router,
                   verified_on=point.measured_on, model=model)

    @classmethod
    def for_traffic(cls, traffic: Workload, *, model_path: str, model_name: str, gpu: str, gpus_per_host: int,
                    model: ModelSpec | None = None, vllm_version: str | None = None,
                    verified_on: str | None = None) -> RecipeContext:
        """A workload's context: its typical request for the benchmark, its longest (capped at the model's
        context) for --max-model-len, prefix caching and the router policy from its prefixes."""
        spec = model if model is not None else model_or_none(model_path)
        limit = context_limit(traffic, spec.max_position_embeddings if spec is not None else None)
        shares = traffic.trace is not None or traffic.prefix is not None
        return cls(model_path=absolute_model_path(model_path), model_name=model_name, gpu=gpu,
                   gpus_per_host=gpus_per_host, isl=traffic.isl, osl=traffic.osl,
                   concurrency=() if traffic.open_loop else tuple(traffic.concurrency), vllm_version=vllm_version,
                   prefix_caching=True if shares else None, max_model_len=limit.max_model_len,
                   router=choose_router_policy(traffic), verified_on=verified_on, model=spec)

    @classmethod
    def for_space(cls, space: SearchSpace, *, model_path: str, model_name: str,
                  verified_on: str | None = None) -> RecipeContext:
        """The context of a campaign's exports (the CLI's `export` and the API's /export build it here)."""
        gpu = get_gpu(space.cluster.gpu)
        first = next(iter(space.phases.values()))
        ctx = cls.for_traffic(space.traffic, model_path=model_path, model_name=model_name, gpu=gpu.name,
                              gpus_per_host=space.cluster.gpus_per_host or gpu.gpus_per_host,
                              vllm_version=space.cluster.vllm_version, verified_on=verified_on)
        return replace(ctx, concurrency=tuple(first.concurrency))



def _plan(deployment: Deployment, ctx: RecipeContext, **settings: object) -> LaunchPlan:
    """hostN placeholders (the user maps them to hosts), packed so no TP group straddles hosts; the PD pairing
    check reads the model's config when it is readable here. The settings are the trial's (point_plan_settings)."""
    spec = ctx.model_spec
    if spec is not None:  # what the model cannot take (MTP without MTP layers, EP on a dense model, ...)
        for group in deployment.groups:
            group.topology.check(spec)
    point = ctx.operating_point(deployment)
    return build_plan(deployment, pack_hosts(deployment, ctx.gpus_per_host),
                      point_plan_settings(point, model=ctx.model_spec, **settings), resolve=keep_names,
                      model=ctx.model_spec)


def router_lines(plan: LaunchPlan, ctx: RecipeContext) -> list[str]:
    """The router's policy and why, as comment lines (none when one server needs no router)."""
    return [f"# Router policy {ctx.router.policy}: {ctx.router.reason}."] if plan.fronts else []


def to_vllm_commands(deployment: Deployment, ctx: RecipeContext) -> str:
    plan = _plan(deployment, ctx)
    lines = ["#!/usr/bin/env bash", f"# {deployment.name} on {deployment.num_gpus} x {ctx.gpu} "
             f"({ctx.gpus_per_host} GPUs per host), typical request {ctx.isl}/{ctx.osl} tokens in/out. "
             "Generated by topotune.", ctx.verified_line(), *router_lines(plan, ctx),
             "# Run each host's commands on that host (hostN = your host addresses); start servers before the router.",
             f"# Clients talk to {plan.endpoint}.", "set -euo pipefail"]
    for host in plan.hosts():
        lines.append(f"\n### {host}")
        for proc in plan.for_host(host):
            lines.append(f"# {proc.name} ({proc.role})")
            lines.append(proc.shell() + " &")
    lines.append("wait")
    return "\n".join(lines) + "\n"


VLLM_ROUTER_VERSION = "0.1.17"  # the router the CPU tests run (scripts/setup-cpu-vllm.sh)
MODEL_DIR_VARIABLE = "MODEL_DIR"


def container_model_path(ctx: RecipeContext) -> str:
    """Where a container sees the weights: /models/<folder> for a local folder (mounted from $MODEL_DIR), or the
    hub id itself (vLLM downloads it)."""
    if not is_local_path(ctx.model_path):
        return ctx.model_path
    return f"{CONTAINER_MODELS_DIR}/{Path(ctx.model_path).name or 'model'}"


def to_compose(deployment: Deployment, ctx: RecipeContext) -> str:
    """One service per process, the image pinned to the targeted vLLM, the weights mounted from $MODEL_DIR."""
    inside = container_model_path(ctx)
    local = inside != ctx.model_path
    plan = _plan(deployment, replace(ctx, model_path=inside, model=ctx.model_spec))
    default_dir = str(Path(ctx.model_path).expanduser().resolve()) if local else ""
    services = {}
    for proc in plan.processes:
        gpu_ids = proc.env.get("CUDA_VISIBLE_DEVICES")
        router = proc.role == "router"
        service: dict = {
            "image": ctx.image if not router else "python:3.12-slim",
            "network_mode": "host", "ipc": "host",
            "command": list(proc.argv[1:]) if not router else
            ["sh", "-c", f"pip install vllm-router=={VLLM_ROUTER_VERSION} && exec " + shlex.join(proc.argv)],
            "environment": dict(sorted(proc.env.items())),
            "labels": {"topotune.host": proc.host, "topotune.role": proc.role},
        }
        if local and not router:
            service["volumes"] = [f"${{{MODEL_DIR_VARIABLE}:-{default_dir}}}:{inside}:ro"]
        if not router:
            service["entrypoint"] = [proc.argv[0]]
        if gpu_ids:
            service["deploy"] = {"resources": {"reservations": {"devices": [
                {"driver": "nvidia", "device_ids": gpu_ids.split(","), "capabilities": ["gpu"]}]}}}
        if proc.health_url:
            service["healthcheck"] = {"test": ["CMD", "curl", "-fs", proc.health_url], "interval": "30s",
                                      "timeout": "5s", "retries": 60}
        services[proc.name.replace("_", "-")] = service
    mount = (f"# The weights: {MODEL_DIR_VARIABLE}=/path/to/{Path(ctx.model_path).name} docker compose up -d "
             f"(default {default_dir}).\n") if local else ""
    header = (f"# {deployment.name}: one compose project per host (docker compose -p topotune up -d SERVICE...); run "
              "the services labelled with that host.\n"
              f"# Generated by topotune for {ctx.model_name} on {ctx.gpu}; image {ctx.image}.\n{mount}"
              f"{ctx.verified_line()}\n")
    return header + dump_yaml({"services": services})


# Flags srt-slurm derives from its own allocation (srtctl/backends/vllm.py _VLLM_ORCHESTRATION_FLAGS and the DP
# layout it computes), and per-process variables it sets itself (get_process_environment).
_ORCHESTRATION_FLAGS = {"--host", "--port", "--nnodes", "--node-rank", "--master-addr", "--master-port",
                        "--headless", "--data-parallel-size-local", "--data-parallel-address",
                        "--data-parallel-rpc-port", "--data-parallel-start-rank", "--served-model-name"}
_PER_PROCESS_ENV = {"CUDA_VISIBLE_DEVICES", "VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_NIXL_SIDE_CHANNEL_PORT", "VLLM_PORT"}


def serve_flags(argv: Sequence[str]) -> list[tuple[str, str | None]]:
    """A plan's `vllm serve` flags after the model, each with its value (None: a switch such as
    --enable-expert-parallel)."""
    out: list[tuple[str, str | None]] = []
    i = 0
    while i < len(argv):
        has_value = i + 1 < len(argv) and not argv[i + 1].startswith("--")
        out.append((argv[i], argv[i + 1] if has_value else None))
        i += 2 if has_value else 1
    return out


def _role_args(plan: LaunchPlan, role: str) -> tuple[dict[str, object], dict[str, str]]:
    """A role's vLLM flags (as srt-slurm `args`) and environment, read from the plan's own first process of
    that role, so a recipe carries exactly what the trial launched (speculative config on prefill too,
    --block-size, the hybrid and UCX settings)."""
    proc = next(p for p in plan.servers if p.role == role)
    args: dict[str, object] = {}
    for flag, value in serve_flags(proc.argv[proc.argv.index("serve") + 2:]):
        if flag not in _ORCHESTRATION_FLAGS:
            args[flag.removeprefix("--")] = (True if value is None
                                             else json.loads(value) if value.startswith("{") else value)
    env = {k: v for k, v in sorted(proc.env.items()) if k not in _PER_PROCESS_ENV}
    return args, env


def to_srt_slurm(deployment: Deployment, ctx: RecipeContext) -> str:
    plan = _plan(deployment, ctx)
    prefill = deployment.group(Role.PREFILL)
    decode = deployment.group(Role.DECODE) or deployment.group(Role.BOTH)
    nodes = lambda g: -(-g.num_gpus // ctx.gpus_per_host) if g else 0  # noqa: E731
    config: dict[str, dict] = {}
    environment: dict[str, dict[str, str]] = {}
    for group in (prefill, decode):
        if group is None:
            continue
        key = "prefill" if group.role is Role.PREFILL else "decode"
        config[key], environment[f"{key}_environment"] = _role_args(plan, group.role.value)
    recipe = {
        "name": f"{ctx.model_name}-{deployment.name}".replace(" ", "_").replace("(", "").replace(")", ""),
        "model": {"path": ctx.model_path, "container": ctx.image, "precision": ctx.precision},
        "resources": {"gpu_type": ctx.gpu, "gpus_per_node": ctx.gpus_per_host,
                      "prefill_nodes": nodes(prefill), "decode_nodes": nodes(decode),
                      "prefill_workers": prefill.count if prefill else 0,
                      "decode_workers": decode.count if decode else 0},
        # srt-slurm passes frontend.args to vllm-router as flags (srtctl/frontends get_frontend_args_list)
        "frontend": ({"type": "vllm-router", "args": {"policy": ctx.router.policy.value}} if plan.fronts
                     else {"type": "none"}),
        "backend": {"type": "vllm", **environment, "vllm_config": config},
        # the workload's typical request (mean input and output tokens), not its longest: --max-model-len holds that
        "benchmark": {"type": "aiperf", "isl": ctx.isl, "osl": ctx.osl,
                      "concurrencies": list(ctx.concurrency) or [1]},
    }
    header = (f"# srt-slurm style recipe for {deployment.name}. Generated by topotune.\n{ctx.verified_line()}\n"
              + "".join(f"{line}\n" for line in router_lines(plan, ctx))
              + f"# Served model name: {ctx.model_name} (srt-slurm sets --served-model-name itself); benchmark "
              f"ISL/OSL: the workload's mean request ({ctx.isl}/{ctx.osl} tokens).\n")
    return header + dump_yaml(recipe)
