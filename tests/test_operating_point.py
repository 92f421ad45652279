"""#46: one recommendation, one plan. `frontier --json` writes the operating point; `plan --from` and
`export --from` deploy exactly it (topology, MTP, batch limits, prefix caching, router policy, served name,
weights, context); `plan --workload` sizes the context from the traffic; the model refuses what it cannot take."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml
from _support.hostile import hostile_path

from tuner.cli import main
from tuner.deployment import Deployment
from tuner.errors import ConfigError
from tuner.operating_point import OperatingPoint, at_running_requests, choose_router_policy, read_operating_point
from tuner.topology import Role, Topology
from tuner.workload import Workload

REPO = Path(__file__).resolve().parents[1]
LLAMA = REPO / "examples" / "models" / "llama-3.1-70b"
TRACE = REPO / "examples" / "traces" / "chat-multiturn.jsonl"


@pytest.fixture(scope="module")
def frontier_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("frontier") / "r.json"
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert main(["frontier", str(LLAMA), "-g", "h200", "--gpus", "16", "--workload", str(TRACE),
                     "--max-itl-ms", "40", "--json"]) == 0
    out.write_text(buffer.getvalue())
    return out


def _server_argv(plan: dict, role: str) -> list[str]:
    return next(p["argv"] for p in plan["processes"] if p["role"] == role)


def _flag(argv: list[str] | tuple[str, ...], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_frontier_writes_the_operating_point_plan_and_export_carry_it(frontier_json: Path, tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    data = json.loads(frontier_json.read_text())
    op = OperatingPoint.from_json(data["recommendation"]["operating_point"])
    assert OperatingPoint.from_json(json.loads(json.dumps(op.as_json()))) == op  # survives JSON
    assert op.router.policy == "cache_aware" and "shared prefixes" in op.router.reason  # the trace shares prefixes
    assert op.prefix_caching is True and op.served_model_name == "llama-3.1-70b"
    assert Path(op.model_path).is_absolute()
    serving = op.deployment.group(Role.DECODE) or op.deployment.group(Role.BOTH)
    assert serving is not None and serving.topology.max_num_seqs < 1024  # the batch that holds the SLA, not 1024
    workload = Workload.from_trace(TRACE)
    assert (op.typical_isl, op.typical_osl) == (workload.isl, workload.osl)  # the mean request, not the maxima
    assert op.max_model_len is not None and op.max_model_len >= sum(workload.longest_request_tokens)
    best = data["recommendation"][data["recommendation"]["winner"]]
    clients = best["num_decode"] * best["decode_concurrency"] if "num_decode" in best else \
        best["num_instances"] * best["concurrency_per_instance"]
    assert op.concurrency == (clients,)  # the benchmark runs the point's own load

    assert main(["plan", "--from", str(frontier_json), "--vllm", "/nonexistent/vllm", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    role = serving.role.value
    argv = _server_argv(plan, role)
    assert _flag(argv, "--max-num-seqs") == str(serving.topology.max_num_seqs)
    assert _flag(argv, "--served-model-name") == "llama-3.1-70b"
    assert _flag(argv, "--max-model-len") == str(op.max_model_len)
    assert "--enable-prefix-caching" in argv and argv[argv.index("serve") + 1] == op.model_path
    router = next(p["argv"] for p in plan["processes"] if p["role"] == "router")
    assert _flag(router, "--policy") == "cache_aware"

    script = tmp_path / "plan.sh"
    assert main(["plan", "--from", str(frontier_json), "--vllm", "/nonexistent/vllm", "--out", str(script)]) == 0
    text = script.read_text()
    assert "# Router policy cache_aware: the trace re-sends" in text
    commands = [shlex.split(line) for line in text.splitlines() if line.endswith(" &") and " serve " in line]
    assert commands and all(c[-1] == "&" and "--max-model-len" in c for c in commands)  # one command per line

    exported = {}
    for fmt in ("vllm", "compose", "srt-slurm", "kubernetes", "dynamo"):
        assert main(["export", "--from", str(frontier_json), "--format", fmt]) == 0
        exported[fmt] = capsys.readouterr().out
    assert f"--max-num-seqs {serving.topology.max_num_seqs} " in exported["vllm"]
    assert "--policy cache_aware" in exported["vllm"]
    compose = yaml.safe_load(exported["compose"])
    server = next(s for s in compose["services"].values() if s["labels"]["topotune.role"] == role)
    assert server["image"] == f"vllm/vllm-openai:v{op.vllm_version}"
    assert server["volumes"] == [f"${{MODEL_DIR:-{op.model_path}}}:/models/llama-3.1-70b:ro"]
    assert _flag(server["command"], "--max-num-seqs") == str(serving.topology.max_num_seqs)
    assert _flag(server["command"], "serve") == "/models/llama-3.1-70b"
    for fmt in ("kubernetes", "dynamo"):  # the same batch limit and router choice in the manifests
        assert "- --max-num-seqs\n" in exported[fmt] and f"- '{serving.topology.max_num_seqs}'" in exported[fmt]
    assert "--policy cache_aware" in exported["kubernetes"] and "value: kv" in exported["dynamo"]
    srt = yaml.safe_load(exported["srt-slurm"])
    assert srt["benchmark"]["isl"] == workload.isl and srt["benchmark"]["osl"] == workload.osl
    assert srt["benchmark"]["concurrencies"] == [clients]
    assert srt["backend"]["vllm_config"]["decode"]["max-num-seqs"] == str(serving.topology.max_num_seqs)
    assert srt["frontend"] == {"type": "vllm-router", "args": {"policy": "cache_aware"}}  # the router's flag
    assert "# Router policy cache_aware: " in exported["srt-slurm"]


def test_a_front_row_is_chosen_with_point(frontier_json: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = json.loads(frontier_json.read_text())
    rows = [*data["front"], *data["aggregated_front"]]
    last = len(rows) - 1
    chosen = read_operating_point(frontier_json, last).deployment
    assert chosen.num_gpus == rows[last]["num_gpus"] and not chosen.is_disaggregated  # the last aggregated row
    assert main(["plan", "--from", str(frontier_json), "--point", str(last + 1)]) == 2
    assert "--point" in capsys.readouterr().err
    assert main(["plan", "TP8", "--from", str(frontier_json)]) == 2
    assert main(["plan", "--from", str(frontier_json), "--mtp", "1"]) == 2
    assert "--mtp is given by the operating point" in capsys.readouterr().err


def test_a_bad_operating_point_names_its_field(tmp_path: Path, frontier_json: Path) -> None:
    data = json.loads(frontier_json.read_text())
    del data["recommendation"]["operating_point"]["gpus_per_host"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(ConfigError) as err:
        read_operating_point(bad)
    assert err.value.field.endswith("recommendation.operating_point.gpus_per_host")
    (tmp_path / "old.json").write_text(json.dumps({"recommendation": {"winner": None}}))
    with pytest.raises(ConfigError, match=r"no recommendation\.operating_point"):
        read_operating_point(tmp_path / "old.json")


@pytest.mark.parametrize(("kind", "says"), [("fifo", "FIFO (named pipe), not a regular file"),
                                             ("directory", "a directory, not a regular file"),
                                             ("not utf-8", "is not UTF-8"), ("not json", "is not JSON")])
def test_a_from_file_that_is_no_frontier_file_is_refused(tmp_path: Path, kind: str, says: str,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """--from is read like every file a user names (tuner/files.py): a FIFO (a plain read blocks for ever) or a
    directory is a one-line error naming the flag, exit 2."""
    path = hostile_path(tmp_path / "point.json", kind, b'{"front": [\xff]}' if kind == "not utf-8" else b"{nope")
    assert main(["export", "--from", str(path), "--format", "vllm"]) == 2
    err = capsys.readouterr().err
    assert "--from: " in err and says in err and "(fix: " in err, err


def test_plan_workload_sizes_the_context_and_warns_about_refused_requests(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    base = ["plan", "2x:TP8", "--model", str(LLAMA), "-g", "h200", "--vllm", "/nonexistent/vllm", "--json"]
    assert main([*base, "--workload", str(TRACE)]) == 0
    out = capsys.readouterr()
    plan = json.loads(out.out)
    longest = Workload.from_trace(TRACE).max_model_len
    assert _flag(_server_argv(plan, "both"), "--max-model-len") == str(longest)
    assert plan["operating_point"]["router"]["policy"] == "cache_aware" and "router policy cache_aware" in out.err
    long = tmp_path / "long.yaml"  # some prompts longer than Llama-3.1's 131,072-token context
    long.write_text(yaml.safe_dump({"input_tokens": {"distribution": "lognormal", "mean": 60000, "stddev": 60000,
                                                     "max_tokens": 400000}, "output_tokens": 500}))
    assert main([*base, "--workload", str(long)]) == 0
    out = capsys.readouterr()
    assert _flag(_server_argv(json.loads(out.out), "both"), "--max-model-len") == "131072"
    assert "vLLM refuses them" in out.err and "of requests need more than --max-model-len 131,072" in out.err
    assert json.loads(out.out)["operating_point"]["router"]["policy"] == "round_robin"


def test_plan_refuses_mtp_on_a_model_without_mtp_layers(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "2x:TP8", "--mtp", "2", "--model", str(LLAMA), "-g", "h200",
                 "--vllm", "/nonexistent/vllm"]) == 2
    err = capsys.readouterr().err
    assert "has no MTP layers" in err and "--mtp 0" in err and "draft model" in err
    assert main(["plan", "TEP8", "--model", str(LLAMA), "--vllm", "/nonexistent/vllm"]) == 2
    assert "expert parallelism on a dense model" in capsys.readouterr().err  # any flag the model cannot take


def test_the_router_policy_follows_the_traffic() -> None:
    assert choose_router_policy(Workload.from_trace(TRACE)).policy == "cache_aware"
    assert choose_router_policy(Workload.fixed(1024, 128)).policy == "round_robin"
    shared = Workload.model_validate({"isl": 2048, "osl": 128, "prefix": {"shared_tokens": 1024}})
    assert choose_router_policy(shared).policy == "cache_aware"


def test_a_point_runs_the_batch_it_measured_not_the_ladder_maximum() -> None:
    pd = Deployment.disaggregated(Topology.parse("TP4", max_num_seqs=256), 1,
                                  Topology.parse("TP2DP2", max_num_seqs=256), 2)
    capped = at_running_requests(pd, 127)  # per decode instance, over its 2 DP ranks
    decode, prefill = capped.group(Role.DECODE), capped.group(Role.PREFILL)
    assert decode is not None and decode.topology.max_num_seqs == 64
    assert prefill is not None and prefill.topology.max_num_seqs == 256  # the prefill side keeps its own
    assert at_running_requests(pd, 10_000).group(Role.DECODE).topology.max_num_seqs == 256  # never above the trial's


def test_export_refuses_a_point_the_model_cannot_take(frontier_json: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    data = json.loads(frontier_json.read_text())
    op = data["recommendation"]["operating_point"]
    for group in op["deployment"]["groups"]:
        group["topology"]["mtp"] = 2  # Llama has no MTP head
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(data))
    assert main(["export", "--from", str(edited), "--format", "kubernetes"]) == 2
    err = capsys.readouterr().err
    assert "has no MTP layers" in err and "--mtp 0" in err
