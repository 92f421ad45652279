"""Every serving knob is one Topology field; each place that derives from it (docs/architecture.md, "knobs") must
carry every knob: the space's choices and parameters, the vLLM flags, the launch risks, the CLI options."""

from __future__ import annotations

import pytest
import typer
from _support.cpu_vllm import needs_envs

from tuner.backends.vllm import PlanSettings, build_plan, default_envs_dir, keep_names, pack_hosts, topology_flags
from tuner.backends.vllm._argv_check import run_check
from tuner.cli import app
from tuner.cli._knobs import option_names
from tuner.cluster import risk_key
from tuner.cluster._knowledge import RISK_FIELDS
from tuner.deployment import Deployment, parse_deployment
from tuner.space import PhaseSpace, parse_space
from tuner.topology import KNOBS, Role, Topology, knob_default

# a launchable value other than the default for each knob, on one layout that has them all (EP over DP ranks)
EVERY_KNOB_SET = {"tp": 2, "dp": 2, "ep": True, "mtp": 1, "gpu_memory_utilization": 0.8, "max_num_seqs": 64,
                  "max_num_batched_tokens": 4096, "kv_cache_dtype": "fp8", "num_redundant_experts": 4,
                  "max_cudagraph_capture_size": 512, "stream_interval": 4,
                  "all2all_backend": "deepep_high_throughput", "dbo": True}
NOT_KNOBS = {"pp", "role"}  # pp is fixed at 1; role is the phase a config runs, not a setting of it


def test_every_topology_field_is_a_knob_or_named_otherwise() -> None:
    assert set(Topology.model_fields) == set(KNOBS) | NOT_KNOBS
    assert set(EVERY_KNOB_SET) == set(KNOBS)  # a new knob needs a value here (and goes through every test below)
    assert all(EVERY_KNOB_SET[name] != knob_default(name) for name in KNOBS)


def test_the_space_searches_every_knob_in_field_order() -> None:
    """Two choices of each knob: each is a field of a phase and a parameter of its trials, in KNOBS order, and a
    config's parameters give the config back."""
    assert [name for name in PhaseSpace.model_fields if name in KNOBS] == list(KNOBS)
    choices = {name: [knob_default(name) if knob_default(name) is not None else "auto", value]
               for name, value in EVERY_KNOB_SET.items()}
    lines = "\n".join(f"    {name}: {[v if not isinstance(v, bool) else str(v).lower() for v in values]}"
                      for name, values in choices.items())
    space = parse_space(f"name: k\ncluster: {{gpu: gb300, num_gpus: 8}}\nworkload: {{isl: 100, osl: 10}}\n"
                        f"phases:\n  decode:\n{lines}\n    concurrency: [1]\n")
    assert list(space.param_choices("decode")) == list(KNOBS)
    params = dict(EVERY_KNOB_SET)
    topo = space.topology("decode", params)
    assert {name: getattr(topo, name) for name in KNOBS} == EVERY_KNOB_SET
    assert space.params_of("decode", topo) == params
    assert space.topology("decode", space.params_of("decode", topo)) == topo


def test_every_knob_prints_as_its_vllm_flag() -> None:
    """topology_flags prints each knob at a value other than vLLM's default; the capture size (a flag whose name
    depends on the vLLM version) is printed by the plan."""
    topo = Topology(**EVERY_KNOB_SET, role=Role.DECODE)
    flags = topology_flags(topo)
    plan = build_plan(Deployment.single(topo), pack_hosts(Deployment.single(topo), 8),
                      PlanSettings(model_path="/m"), resolve=keep_names)
    argv = plan.servers[0].argv
    for name, knob in KNOBS.items():
        printed = argv if knob.by_plan else flags
        assert knob.flag.split(".")[0] in printed, name  # a dotted flag is a key of vLLM's JSON flag
    assert "--max-cudagraph-capture-size" not in flags
    at_defaults = topology_flags(Topology())
    assert set(at_defaults) & {k.flag for k in KNOBS.values() if not k.always} == set()  # vLLM's defaults: no flag


def test_risk_fields_are_the_knobs_that_decide_a_launch() -> None:
    assert set(KNOBS) - set(RISK_FIELDS) == {"stream_interval"}  # the API server's buffering starts nothing
    crashed = Topology(tp=2, dp=2, ep=True, max_cudagraph_capture_size=512)
    assert risk_key(crashed) != risk_key(crashed.model_copy(update={"max_cudagraph_capture_size": 256}))
    assert risk_key(crashed) == risk_key(crashed.model_copy(update={"stream_interval": 8}))


@pytest.mark.parametrize(("command", "left_out"), [("simulate", set()), ("memory", set()),
                                                   ("frontier", {"mtp"}), ("plan", {"mtp", "max_num_seqs"})])
def test_the_cli_offers_every_knob_under_vllms_flag(command: str, left_out: set[str]) -> None:
    """simulate, memory, frontier and plan take every knob but the layout's (named by --topology or the
    deployment, swept by frontier); frontier sweeps MTP with --max-mtp; plan's --mtp and --max-num-seqs are the
    decode side's (its own options)."""
    click_command = typer.main.get_command(app).commands[command]  # type: ignore[attr-defined]
    opts = {opt for param in click_command.params for opt in (*param.opts, *param.secondary_opts)}
    knob_params = {param.name for param in click_command.params if param.name in KNOBS} - left_out
    assert knob_params == {name for name, knob in KNOBS.items() if not knob.layout and name not in left_out}
    assert all(option_names(name)[0].split("/")[0] in opts for name in knob_params)
    assert {"--enable-dbo", "--eplb-config.num_redundant_experts", "--all2all-backend"} <= opts
    assert ("--mtp" in opts) is (command != "frontier")


def test_a_pd_plan_puts_each_knob_on_the_side_that_has_it() -> None:
    """`plan 1P:TP4,1D:DEP16 --enable-dbo --eplb-config.num_redundant_experts 32`: DBO and EPLB on the decode
    side (EP over DP ranks), not on a TP4 prefill that has no all-to-all; the other knobs on both."""
    dep = parse_deployment("1P:TP4,1D:DEP16", dbo=True, num_redundant_experts=32, kv_cache_dtype="fp8")
    prefill, decode = (dep.group(role).topology for role in (Role.PREFILL, Role.DECODE))  # type: ignore[union-attr]
    assert (prefill.dbo, prefill.num_redundant_experts, prefill.kv_cache_dtype) == (False, 0, "fp8")
    assert (decode.dbo, decode.num_redundant_experts, decode.kv_cache_dtype) == (True, 32, "fp8")


@pytest.mark.slow
@needs_envs
def test_vllms_own_parser_takes_the_cli_options_as_flags() -> None:
    """The options keep vLLM's spelling: vLLM's `serve` parser reads each knob's option and value (mtp aside: vLLM
    spells it as a speculative config)."""
    argv = ["/m", "--tensor-parallel-size", "2", "--data-parallel-size", "2", "--enable-expert-parallel"]
    for name, knob in KNOBS.items():
        if knob.layout or knob.cli:
            continue
        flag = option_names(name)[0].split("/")[0]
        argv += [flag] if isinstance(EVERY_KNOB_SET[name], bool) else [flag, str(EVERY_KNOB_SET[name])]
    argv += ["--enable-eplb"]  # vLLM's switch for EPLB (the plan prints it with the redundant experts)
    results = run_check(default_envs_dir() / "vllm" / "bin" / "python", "vllm",
                        [{"name": "knobs", "argv": argv, "env": {}}])
    assert results[0]["ok"], results[0]["error"]
