"""Proof without a GPU: every `vllm serve` argv the GPU plans produce is parsed by vLLM's own parser and
EngineArgs (plus the KV-transfer, speculative and parallel configs and the VLLM_* variables), AIPerf's argv by
AIPerf's own CLI parser, the router's by `vllm-router --help`. All in the installed CPU venvs, in one subprocess
each, so a misspelt or removed flag fails CI (`make test` runs slow tests)."""

from __future__ import annotations

import itertools
import subprocess
from pathlib import Path

import pytest
from _support.cpu_vllm import CPU_SETTINGS, needs_envs

from tuner.backends.vllm import PlanSettings, build_plan, default_envs_dir, detect_version, keep_names, pack_hosts
from tuner.backends.vllm._aiperf import AiperfRun
from tuner.backends.vllm._argv_check import run_check
from tuner.deployment import Deployment, parse_deployment
from tuner.topology import Role, Topology

pytestmark = [pytest.mark.slow, needs_envs]

CAMPAIGN = ("TP8", "TEP8", "DEP16", "TP4DP4+EP", "TP4DP2+EP", "TP2DP4+EP")
DECODE = ("TEP8", "TP4DP4+EP", "DEP16", "TP8")


def _deployments() -> list[tuple[Deployment, bool, str | None]]:
    """(deployment, hybrid model, vLLM version) for every GPU plan shape the campaign uses."""
    out: list[tuple[Deployment, bool, str | None]] = []
    for prefill, decode, mtp in itertools.product(CAMPAIGN, DECODE, range(4)):  # every pair, MTP 0-3, 1P1D
        out.append((parse_deployment(f"1P:{prefill},1D:{decode}", mtp=mtp, max_num_seqs=256), True, None))
    for x, pair in itertools.product(range(1, 8), (("TP4DP2+EP", "TEP8"), ("TP2DP4+EP", "TP4DP4+EP"))):
        out.append((parse_deployment(f"{x}P:{pair[0]},1D:{pair[1]}", mtp=3), x % 2 == 0, None))  # 1P1D..7P1D
    for name, mtp in itertools.product(CAMPAIGN, range(4)):  # phase trials and aggregated instances
        out.append((Deployment.single(Topology.parse(name, mtp=mtp, role=Role.DECODE)), False, None))
        out.append((parse_deployment(f"2x:{name}", mtp=mtp), False, None))
    out.append((Deployment.single(Topology.parse("TP8", role=Role.PREFILL, max_cudagraph_capture_size=256)),
                False, None))
    out.append((parse_deployment("1P:TEP4,1D:TEP4", mtp=2), True, "0.20.2"))  # the pre-HMA-default flags
    out.append((parse_deployment("1P:TP4DP2+EP,1D:DEP16", stream_interval=50), True, None))  # --stream-interval
    for backend in ("flashinfer_nvlink_one_sided", "flashinfer_nvlink_two_sided", "deepep_high_throughput",
                    "deepep_low_latency"):  # --all2all-backend (vLLM's default is not repeated)
        out.append((parse_deployment("1P:TP4DP2+EP,1D:DEP16", all2all_backend=backend), True, None))
    out.append((parse_deployment("1P:TP4DP2+EP,1D:DEP16", dbo=True), True, None))  # --enable-dbo + DeepEP LL
    for kv in ("fp8", "fp8_e4m3", "nvfp4"):  # the memory knobs' flags (--kv-cache-dtype, EPLB)
        out.append((parse_deployment("1P:TP4DP2+EP,1D:DEP16", mtp=1, kv_cache_dtype=kv, num_redundant_experts=32),
                    True, None))
    return out


def _wide_ep() -> list[Deployment]:
    """Multi-host wide EP on 8-GPU hosts without multi-node NVLink: DeepEP over RDMA, DBO, EPLB, per-host DP."""
    return [parse_deployment("1P:DEP16,1D:DEP32", all2all_backend="deepep_low_latency", dbo=True,
                             num_redundant_experts=32, max_num_seqs=256),
            parse_deployment("2x:DEP16", all2all_backend="deepep_high_throughput", dbo=True, num_redundant_experts=16),
            Deployment.single(Topology.parse("DEP32", role=Role.DECODE, all2all_backend="allgather_reducescatter"))]


def _plans(version: str):  # type: ignore[no-untyped-def]
    for dep, hybrid, target in _deployments():
        settings = PlanSettings(model_path="/models/m", served_model_name="m", max_model_len=9728,
                                vllm_version=target or version, model_is_hybrid=hybrid, multi_node_nvlink=True)
        yield dep, build_plan(dep, pack_hosts(dep, 4), settings, resolve=keep_names)
    for dep in _wide_ep():
        settings = PlanSettings(model_path="/models/m", served_model_name="m", max_model_len=4096,
                                vllm_version=version)
        yield dep, build_plan(dep, pack_hosts(dep, 8), settings, resolve=keep_names)


def _server_items(version: str) -> tuple[list[dict], list[tuple[str, ...]]]:
    items, routers, seen = [], [], set()
    for dep, plan in _plans(version):
        for proc in plan.servers:
            argv = list(proc.argv[proc.argv.index("serve") + 1:])
            key = (tuple(argv), tuple(sorted(proc.env.items())))
            if key not in seen:
                seen.add(key)
                items.append({"name": f"{dep.name} {proc.name}", "argv": argv, "env": proc.env})
        routers += [p.argv for p in plan.fronts]
    return items, routers


def _vllm_python() -> str:
    return str(default_envs_dir() / "vllm" / "bin" / "python")


@pytest.fixture(scope="module")
def installed_version() -> str:
    found = detect_version(CPU_SETTINGS.vllm_argv)
    assert found is not None, "the CPU vLLM venv reports no version"
    return str(found)


def test_every_gpu_plan_argv_parses_with_vllms_own_parser_and_configs(installed_version: str) -> None:
    items, _ = _server_items(installed_version)
    cpu = build_plan(parse_deployment("1P:TP1,1D:TP1"), pack_hosts(parse_deployment("1P:TP1,1D:TP1"), 2),
                     PlanSettings(model_path="/m", device="cpu", pd_block_size=128), resolve=keep_names)
    items += [{"name": f"cpu {p.name}", "argv": list(p.argv[p.argv.index("serve") + 1:]), "env": p.env}
              for p in cpu.servers]
    hetero = parse_deployment("1P:TP4DP2+EP,1D:TEP8", mtp=3)  # `topotune plan --no-prefix-caching` (issue 38)
    no_prefix = build_plan(hetero, pack_hosts(hetero, 4), PlanSettings(
        model_path="/m", model_is_hybrid=True, extra_flags=("--no-enable-prefix-caching",)), resolve=keep_names)
    items += [{"name": f"no prefix caching {p.name}", "argv": list(p.argv[p.argv.index("serve") + 1:]),
               "env": p.env} for p in no_prefix.servers]
    assert len(items) > 300  # every pair x MTP x node rank, deduplicated
    assert any({"deepep_low_latency", "--enable-dbo", "--enable-eplb", "--data-parallel-start-rank"} <= set(i["argv"])
               for i in items)  # the multi-host wide-EP plans are among them
    # the check must be able to fail: a misspelt flag, a removed one, a bad env value, a bad speculative method
    bad = [
        {"name": "misspelt", "argv": ["/m", "--tensor-parallel-sise", "8"], "env": {}},
        {"name": "removed", "argv": ["/m", "--cuda-graph-sizes", "512"], "env": {}},
        {"name": "env", "argv": ["/m"], "env": {"VLLM_SSM_CONV_STATE_LAYOUT": "XY"}},
        {"name": "method", "argv": ["/m", "--speculative-config", '{"method": "mtpp"}'], "env": {}},
        {"name": "nnodes", "argv": ["/m", "--tensor-parallel-size", "4", "--nnodes", "3"], "env": {}},
    ]
    results = run_check(_vllm_python(), "vllm", items + bad)
    failed = [r for r in results[:len(items)] if not r["ok"]]
    assert not failed, f"{len(failed)} of {len(items)} argvs rejected by vLLM {installed_version}, e.g. {failed[:3]}"
    assert [r["ok"] for r in results[len(items):]] == [False] * len(bad), results[len(items):]
    assert "tensor-parallel-sise" in results[len(items)]["error"]


def test_aiperf_argv_parses_with_aiperfs_own_cli(tmp_path: Path) -> None:
    python = str(default_envs_dir() / "aiperf" / "bin" / "python")
    items = [{"name": f"c{c}", "argv": AiperfRun(model="m", tokenizer="/models/m", url="http://10.0.0.1:8000",
                                                  isl=8192, osl=1024, concurrency=c, request_count=2 * c,
                                                  warmup_request_count=c, request_timeout_s=600,
                                                  ).argv(tmp_path)[1:]}
             for c in (1, 64, 2560)]
    # every workload kind (tests/backends/test_vllm_replay.py): normal lengths, Poisson, a replayed file
    replay = tmp_path / "requests.jsonl"
    replay.write_text('{"timestamp": 0, "input_length": 600, "output_length": 8, "hash_ids": [0, 1]}\n')
    common = {"model": "m", "tokenizer": "topotune/tokenizer-0", "url": "http://10.0.0.1:8000", "request_count": 24}
    kinds = {"normal": AiperfRun(**common, isl=300, isl_stddev=60, osl=10, osl_stddev=3, concurrency=4,
                                 warmup_request_count=4),
             "poisson": AiperfRun(**common, isl=300, osl=10, request_rate=2.5, warmup_request_count=3),
             "replay": AiperfRun(**common, isl=1, osl=1, input_file=str(replay), block_tokens=512, concurrency=4),
             "replay-rate": AiperfRun(**common, isl=1, osl=1, input_file=str(replay), block_tokens=512,
                                      request_rate=1.5),
             "trace": AiperfRun(**common, isl=1, osl=1, input_file=str(replay), block_tokens=128,
                                fixed_schedule=True)}
    items += [{"name": name, "argv": run.argv(tmp_path)[1:]} for name, run in kinds.items()]
    bad = [{"name": "misspelt", "argv": [*items[0]["argv"], "--warmup-request-cont", "1"]}]
    results = run_check(python, "aiperf", items + bad)
    assert [r["ok"] for r in results] == [True] * len(items) + [False], results


def test_router_argv_uses_only_flags_vllm_router_knows(installed_version: str) -> None:
    router = default_envs_dir() / "router" / "bin" / "vllm-router"
    help_text = subprocess.run([str(router), "--help"], capture_output=True, text=True, timeout=120,
                               check=True).stdout
    _, routers = _server_items(installed_version)
    assert routers
    known = {word.rstrip(",.") for word in help_text.split() if word.startswith("--")}
    for argv in routers:
        flags = {a for a in argv[1:] if a.startswith("--")}
        assert flags <= known, f"flags vllm-router does not know: {sorted(flags - known)}"
        assert argv[argv.index("--policy") + 1] in help_text  # the policy is one of its choices
