"""`topotune plan` as the issue's new user ran it: the reference deployment with MTP3 on GB300."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuner.cli import main


def test_the_issues_command_plans_what_the_campaign_needs(reference_model_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    args = ["plan", "1P:TP4DP2+EP,1D:TEP8", "--model", str(reference_model_path), "--hardware", "gb300",
            "--mtp", "3", "--isl", "8192", "--osl", "1024", "--vllm", "/nonexistent/vllm", "--json"]
    # TP4 -> TP8: the hybrid block sizes differ per TP (1,088 vs 576 tokens) and vLLM 0.32's prefix caching
    # refuses that at the first request (issue 38); without prefix caching the pair runs
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "prefix caching with physical blocks per logical block 17" in err
    assert "(--no-prefix-caching: vLLM's --no-enable-prefix-caching)" in err  # the fix as this command's flag
    code = main([*args, "--no-prefix-caching"])
    assert code == 0
    plan = json.loads(capsys.readouterr().out)
    servers = [p for p in plan["processes"] if p["role"] != "router"]
    assert {p["role"] for p in servers} == {"prefill", "decode"}
    for proc in servers:
        argv = proc["argv"]
        assert argv[argv.index("--speculative-config") + 1] == '{"method": "mtp", "num_speculative_tokens": 3}'
        assert argv[argv.index("--block-size") + 1] == "64"
        assert argv[argv.index("--max-model-len") + 1] == "9728"
        assert proc["env"]["VLLM_SSM_CONV_STATE_LAYOUT"] == "DS"  # read from the model folder: hybrid
        assert "--no-enable-prefix-caching" in argv
    hosts = {p["host"] for p in servers}
    assert len(hosts) == 4  # TP4DP2 on two whole hosts, TEP8 on two more


def test_plan_names_the_version_and_refuses_what_it_cannot_run(reference_model_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "1P:TP4,1D:TEP8", "--model", str(reference_model_path), "--vllm-version", "0.26.1rc1",
                 "--vllm", "/nonexistent/vllm", "--no-prefix-caching"]) == 0
    assert "# vLLM 0.26.1 (given); hybrid model: True" in capsys.readouterr().out
    assert main(["plan", "1P:TP4,1D:TEP8", "--model", str(reference_model_path), "--vllm-version", "0.19.1",
                 "--vllm", "/nonexistent/vllm", "--no-prefix-caching"]) == 2
    assert "target vLLM >= 0.20.0" in capsys.readouterr().err
    assert main(["plan", "1P:TP4,1D:TEP8", "--model", str(reference_model_path), "--vllm-version", "0.21.0",
                 "--vllm", "/nonexistent/vllm"]) == 2  # no GDN transfer before 0.22.0, whatever the TP
    assert "target vLLM >= 0.22.0" in capsys.readouterr().err
    assert main(["plan", "TP4", "--hosts", "no-such-host.invalid", "--vllm", "/nonexistent/vllm"]) == 2
    assert "does not resolve" in capsys.readouterr().err
    assert main(["plan", "1P:TP4,1D:TP4", "--front", "dynamo"]) == 2  # the option is gone


@pytest.mark.parametrize("printed", ["4P(TP2DP4 MTP3) 1D(TP2DP8+EP MTP3)", "4P(TP1) 1D(DP4)", "4x(TP4DP4 MTP3)",
                                     "1P(TP8) 8D(TP8)"])
def test_plan_takes_a_deployment_as_frontier_prints_it(printed: str, capsys: pytest.CaptureFixture[str]) -> None:
    """What `frontier` and `tune` print is what `plan` reads: the names round-trip, MTP depth included, and
    --max-num-seqs caps the decode (or aggregated) side only."""
    from tuner.deployment import parse_deployment

    assert parse_deployment(printed).name == printed
    assert main(["plan", printed, "--max-num-seqs", "96", "--isl", "1024", "--osl", "128", "--vllm",
                 "/nonexistent/vllm", "--not-hybrid", "--json"]) == 0
    servers = [p for p in json.loads(capsys.readouterr().out)["processes"] if p["role"] != "router"]
    for proc in servers:
        seqs = proc["argv"][proc["argv"].index("--max-num-seqs") + 1]
        assert (seqs == "96") == (proc["role"] != "prefill")
    assert main(["plan", "1P(TP4 MTP1) 1D(TP4 MTP2)", "--vllm", "/nonexistent/vllm"]) == 2
    assert "two MTP depths" in capsys.readouterr().err


@pytest.mark.parametrize(("args", "field"), [
    (["TEP", "--hardware", "gb300"], "deployment"),
    (["TP8", "--hardware", "h2000"], "--hardware"),
    (["TP8", "--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization"),
    (["TP8", "--kv-cache-dtype", "fp9"], "--kv-cache-dtype"),
])
def test_plan_names_the_flag_to_change(reference_model_path: Path, args: list[str], field: str,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    """The library's fields (hardware, a knob, the layout) as `plan`'s own argument and flags, as `frontier` names
    them, not the library's bare names."""
    assert main(["plan", *args, "--model", str(reference_model_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {field}: ") and "fix:" in err and "Traceback" not in err
