"""`topotune memory`: the KV-cache capacity calculation, for one topology or a sweep."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from tuner.cli._app import HardwareFileOpt, HardwareOpt, ModelArg, app, as_flags, console, print_json
from tuner.cli._knobs import INSTANCE_FLAGS, knob_options
from tuner.errors import ConfigError
from tuner.hardware import get_gpu
from tuner.memory import GIB, MemoryBreakdown, MemoryInputs, Mxfp4Backend, compute_memory, sweep_topologies
from tuner.models import load_model
from tuner.topology import Topology
from tuner.units import parse_bytes


def _render(b: MemoryBreakdown) -> None:
    table = Table(title=f"{b.model} on {b.gpu}, {b.topology} ({b.num_gpus} GPUs): per GPU", title_justify="left")
    table.add_column("quantity")
    table.add_column("GiB", justify="right")
    table.add_column("how")
    for line in b.lines:
        table.add_row(line.label, "" if line.gib is None else f"{line.gib:,.2f}", line.how)
    console.print(table)
    style = "green" if b.fits else "bold red"
    console.print(f"[{style}]{b.verdict()}[/]  (vLLM would log: GPU KV cache size: {b.kv_cache_tokens:,} tokens; "
                  f"Maximum concurrency for {b.max_model_len:,} tokens per request: "
                  f"{b.max_concurrency_at_max_model_len:.2f}x)", highlight=False)


@app.command(help="How much memory each GPU uses and how many requests fit, computed as vLLM does.")
@knob_options()
@as_flags(INSTANCE_FLAGS)
def memory(
    model: ModelArg,
    hardware: HardwareOpt = "gb300",
    topology: Annotated[str, typer.Option(help="TP8, TEP8, DEP8, TP4DP4+EP, ...")] = "TP8",
    isl: Annotated[int, typer.Option(help="Input tokens per request.")] = 8192,
    osl: Annotated[int, typer.Option(help="Output tokens per request.")] = 1024,
    max_model_len: Annotated[int | None, typer.Option(help="Default: isl + osl.")] = None,
    kv_cache_memory_bytes: Annotated[str | None, typer.Option(
        help="Override the KV budget exactly as vLLM's flag does (e.g. 40G).")] = None,
    block_size: Annotated[int | None, typer.Option(help="vLLM --block-size (default: the backend's).")] = None,
    non_torch_gib: Annotated[float | None, typer.Option(help="Measured non-torch memory per GPU.")] = None,
    activation_gib: Annotated[float | None, typer.Option(help="Measured peak activation memory.")] = None,
    cuda_graph_gib: Annotated[float | None, typer.Option(help="Measured CUDA-graph memory.")] = None,
    mxfp4_backend: Annotated[Mxfp4Backend | None, typer.Option(
        help="MXFP4 MoE kernels (their padding): marlin, triton, ...; default: vLLM's for the GPU.")] = None,
    sweep: Annotated[bool, typer.Option(help="Every valid topology for --gpus, sorted by concurrency.")] = False,
    gpus: Annotated[int, typer.Option(help="GPU count for --sweep (and the cluster limit).")] = 72,
    all_sizes: Annotated[bool, typer.Option(
        help="--sweep also tries TP/DP sizes that are not powers of two (EP48, EP72, ...).")] = False,
    hardware_file: HardwareFileOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    knobs: dict[str, Any] | None = None,
) -> None:
    """Long only by its typer options (one per line with their help, as typer declares them); the body is
    short. Its help text is the decorator's `help=`."""
    if gpus < 1:
        raise ConfigError(f"must be positive, got {gpus}", field="--gpus", fix="give the cluster's GPU count")
    spec = load_model(model)
    gpu = get_gpu(hardware, hardware_file)
    inputs = MemoryInputs(
        isl=isl, osl=osl, max_model_len=max_model_len,
        kv_cache_memory_bytes=parse_bytes(kv_cache_memory_bytes, "--kv-cache-memory-bytes")
        if kv_cache_memory_bytes else None,
        non_torch_gib=non_torch_gib, activation_gib=activation_gib, cuda_graph_gib=cuda_graph_gib,
        block_size=block_size, mxfp4_backend=mxfp4_backend)
    engine = dict(knobs or {})
    if sweep:
        Topology.create(**engine)  # validate the shared fields once, with a clear message
        mtp = engine.pop("mtp")
        rows = sweep_topologies(spec, gpu, gpus, inputs, mtp_values=(mtp,), powers_of_two=not all_sizes, **engine)
        if json_out:
            print_json([{**r.memory.to_dict(), "topology": r.topology.name} for r in rows])
            return
        table = Table(title=f"{spec.name} on up to {gpus} x {gpu.name}, {isl}/{osl}: every valid topology",
                      title_justify="left")
        for col in ("topology", "GPUs", "weights GiB/GPU", "KV GiB/GPU", "block", "blocks", "blocks/req",
                    "conc/DP rank", "conc/instance", "conc/GPU", "fits"):
            table.add_column(col, justify="right" if col not in ("topology", "fits") else "left")
        for r in rows:
            b = r.memory
            table.add_row(r.topology.name, str(b.num_gpus), f"{b.weights_gib:.1f}", f"{b.kv_budget_bytes / GIB:.1f}",
                          str(b.layout.block_size), f"{b.num_gpu_blocks:,}", str(b.blocks_per_request),
                          f"{b.max_concurrency:.1f}", f"{b.max_concurrency_instance:.1f}",
                          f"{b.max_concurrency_instance / b.num_gpus:.1f}", "yes" if b.fits else "[red]no[/]")
        console.print(table)
        return
    topo = Topology.parse(topology, **engine)
    topo.check(spec, cluster_gpus=gpus)
    breakdown = compute_memory(spec, gpu, topo, inputs)
    if json_out:
        print_json(breakdown.to_dict())
    else:
        _render(breakdown)
