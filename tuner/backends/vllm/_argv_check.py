"""Parse launch-plan command lines with the tools' own parsers; run by path with the tool venv's python.

    <vllm venv>/bin/python _argv_check.py vllm   < [{"name": ..., "argv": [...after "serve"...], "env": {...}}]
    <aiperf venv>/bin/python _argv_check.py aiperf < [{"name": ..., "argv": [...after "aiperf"...]}]
    from topotune: run_check(python, "vllm" | "aiperf", items)

Prints one JSON list of {"name", "ok", "error"}. vLLM: its `vllm serve` parser (unknown, misspelt or removed
flags, bad values), `EngineArgs.from_cli_args`, the serve subcommand's own validation, the KV-transfer config
object, the speculative config's fields and method, the parallel config vLLM builds from TP/DP/--nnodes, and
every VLLM_* variable against vllm.envs (name and allowed values). What needs the model's weights or a GPU
(the full VllmConfig) is not built. It must not import topotune (not installed in those venvs).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import json
import os
import sys
import typing


def _flatten_literal(tp: object) -> set[str]:
    out: set[str] = set()
    for arg in typing.get_args(tp):
        out |= _flatten_literal(arg) if typing.get_args(arg) else {arg} if isinstance(arg, str) else set()
    return out


@functools.cache
def _vllm_parser():  # type: ignore[no-untyped-def]
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    root = FlexibleArgumentParser(prog="vllm")
    serve = ServeSubcommand()
    serve.subparser_init(root.add_subparsers(dest="subparser"))
    return root, serve


def _check_vllm_env(env: dict[str, str]) -> None:
    import vllm.envs as envs

    for name, value in env.items():
        if not name.startswith("VLLM_"):
            continue
        if name not in envs.environment_variables:
            raise ValueError(f"environment variable {name} is unknown to this vLLM")
        saved = os.environ.get(name)
        os.environ[name] = value
        try:
            envs.environment_variables[name]()  # raises on a value outside the allowed choices
        finally:
            if saved is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = saved


def _check_vllm(item: dict) -> None:
    from vllm.config import KVTransferConfig, ParallelConfig, SpeculativeConfig
    from vllm.config.speculative import SpeculativeMethod
    from vllm.engine.arg_utils import AsyncEngineArgs

    root, serve = _vllm_parser()
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        try:
            args = root.parse_args(["serve", *item["argv"]])
        except SystemExit:
            raise ValueError(stderr.getvalue().strip().splitlines()[-1]) from None
    serve.validate(args)
    engine = AsyncEngineArgs.from_cli_args(args)
    if engine.kv_transfer_config is not None:
        raw = engine.kv_transfer_config
        KVTransferConfig(**(dataclasses.asdict(raw) if dataclasses.is_dataclass(raw) else raw))
    if engine.speculative_config is not None:
        spec = dict(engine.speculative_config)
        unknown = set(spec) - {f.name for f in dataclasses.fields(SpeculativeConfig)}
        if unknown:
            raise ValueError(f"--speculative-config keys unknown to SpeculativeConfig: {sorted(unknown)}")
        if spec.get("method") not in _flatten_literal(SpeculativeMethod):
            raise ValueError(f"--speculative-config method {spec.get('method')!r} is not a SpeculativeMethod")
    fields = {f.name for f in dataclasses.fields(ParallelConfig)}
    parallel = ParallelConfig(**{k: v for k, v in vars(engine).items() if k in fields and v is not None and
                                 k in ("tensor_parallel_size", "data_parallel_size", "pipeline_parallel_size",
                                       "nnodes", "node_rank", "master_addr", "master_port",
                                       "data_parallel_size_local", "enable_expert_parallel")})
    if parallel.nnodes > 1:
        world = parallel.world_size * parallel.data_parallel_size
        if world % parallel.nnodes:
            raise ValueError(f"--nnodes {parallel.nnodes} does not divide the world size {world}")
        _ = parallel.nnodes_within_dp  # vLLM's own divisibility check across DP ranks
    _check_vllm_env(item.get("env", {}))


def _check_aiperf(item: dict) -> None:
    from aiperf.cli import app

    app.parse_args(item["argv"], exit_on_error=False, print_error=False)


def run_check(python: str, tool: str, items: list[dict], timeout_s: float = 600.0) -> list[dict]:
    """From topotune: check `items` in the venv of `python` (one subprocess for all of them)."""
    import subprocess

    proc = subprocess.run([python, __file__, tool], input=json.dumps(items), capture_output=True, text=True,
                          timeout=timeout_s, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith("TOPOTUNE-ARGV-CHECK "):
            return json.loads(line.removeprefix("TOPOTUNE-ARGV-CHECK "))
    raise RuntimeError(f"{tool} argv check exited {proc.returncode}: {proc.stderr.strip()[-2000:]}")


def main() -> int:
    tool = sys.argv[1]
    check = {"vllm": _check_vllm, "aiperf": _check_aiperf}[tool]
    results = []
    for item in json.load(sys.stdin):
        try:
            check(item)
            results.append({"name": item["name"], "ok": True, "error": ""})
        except Exception as exc:  # every failure is a finding, reported with the item's name
            results.append({"name": item["name"], "ok": False, "error": f"{type(exc).__name__}: {exc}"})
    print("\nTOPOTUNE-ARGV-CHECK " + json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
