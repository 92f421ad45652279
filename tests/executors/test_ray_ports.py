"""The local Ray head's GCS port, with real Ray processes: by default the GCS binds a port itself (nothing to race);
a fixed TOPOTUNE_RAY_PORT that is taken fails with a ConfigError naming the setting, whether it is taken before
the start (at once) or between the check and the GCS's bind (after Ray's own failure), and never joins the other
Ray head that took it.

Each head starts in a subprocess: this test process may already be connected to the shared test cluster.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest
from _support.paths import REPO

# Serial (make test's second part): each head must register within Ray's fixed 30 s, which a second xdist worker's
# tests beside it pushed past (test_the_default_head_binds_... failed so in one run).
pytestmark = [pytest.mark.skipif(sys.platform != "linux", reason="real Ray heads on loopback"), pytest.mark.serial]

HANG_GUARD_S = 600  # not a timing assertion: only so a hung start fails instead of blocking the run

# Start the head as ensure_ray (port) or as the start after a lost race (its check passed, then the port was taken:
# _start_local, which runs after the check); print the session or the error as one JSON line.
START = textwrap.dedent("""
    import json, sys
    from tuner.errors import ConfigError
    from tuner.executors import _session
    port, after_check = (int(sys.argv[1]) if sys.argv[1] != "none" else None), sys.argv[2] == "after-check"
    try:
        if after_check:
            s = _session._start_local(num_gpus=1, port=port, num_cpus=1)
        else:
            s = _session.ensure_ray(address=None, num_gpus=1, port=port, num_cpus=1)
        import ray
        out = {"address": s.address, "nodes": len([n for n in ray.nodes() if n["Alive"]])}
    except ConfigError as exc:
        out = {"field": exc.field, "error": str(exc), "ray_started": __import__("ray").is_initialized()}
    finally:
        _session.shutdown_ray()
    print(json.dumps(out))
""")


def _start(port: int | None, *, after_check: bool = False, optimize: bool = False) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_GCS_SERVER_PORT")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    argv = [sys.executable, *(["-O"] if optimize else []), "-c", START, str(port) if port else "none",
            "after-check" if after_check else "checked"]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def other_head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """Another Ray head on this machine (another topotune process's, say), its GCS on a port it bound itself."""
    ready = tmp_path_factory.mktemp("other-head") / "gcs_address"
    script = textwrap.dedent(f"""
        import os, time, ray
        ctx = ray.init(address="local", num_cpus=1, include_dashboard=False, _node_ip_address="127.0.0.1")
        open({str(ready)!r} + ".tmp", "w").write(ctx.address_info["gcs_address"])
        os.rename({str(ready)!r} + ".tmp", {str(ready)!r})
        time.sleep({HANG_GUARD_S})
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_GCS_SERVER_PORT")}
    env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # loopback only, as topotune's own head
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        while not ready.exists():
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = proc.wait(timeout=0.5)
                raise AssertionError(f"the other head exited with {code}: {proc.stderr.read()[-3000:]}")
        yield int(ready.read_text().rsplit(":", 1)[1])
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)  # ray.init's handler exits, and its atexit stops the head
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_the_default_head_binds_a_gcs_port_itself_while_the_old_default_is_taken() -> None:
    """No TOPOTUNE_RAY_PORT: the head starts whoever holds 6390 (the port the old default chose, when free)."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", 6390))
            sock.listen()
        except OSError:
            pass  # some other process already holds it: the same situation
        info = _start(None)
    assert "error" not in info, info
    port = int(info["address"].rsplit(":", 1)[1])
    assert port not in (6390, 6379) and info["nodes"] == 1


def test_a_fixed_port_that_is_taken_is_refused_at_once_naming_the_setting(held_port: int) -> None:
    info = _start(held_port)
    assert info["field"] == "TOPOTUNE_RAY_PORT" and not info["ray_started"], info
    assert str(held_port) in info["error"] and "RAY_ADDRESS" in info["error"]


def test_redis_port_is_refused_as_a_fixed_port() -> None:
    info = _start(6379)
    assert info["field"] == "TOPOTUNE_RAY_PORT" and "Redis" in info["error"] and not info["ray_started"], info


def test_a_fixed_port_taken_after_the_check_fails_naming_the_setting(held_port: int) -> None:
    """The GCS cannot bind the port (another listener took it after the check): Ray fails after its own wait."""
    info = _start(held_port, after_check=True)
    assert info["field"] == "TOPOTUNE_RAY_PORT" and not info["ray_started"], info
    assert str(held_port) in info["error"]


@pytest.mark.parametrize("optimize", [False, True], ids=["asserts", "python-O"])
def test_a_fixed_port_another_ray_head_took_is_never_joined(other_head: int, optimize: bool) -> None:
    """Another Ray head's GCS took the port after the check: the start fails naming the setting instead of joining
    that cluster (Ray's own check is an assert; under python -O topotune's check after the start catches it)."""
    info = _start(other_head, after_check=True, optimize=optimize)
    assert info["field"] == "TOPOTUNE_RAY_PORT" and not info["ray_started"], info
    assert str(other_head) in info["error"]


def test_settings_default_to_no_fixed_port(monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner.settings import TunerSettings

    monkeypatch.delenv("TOPOTUNE_RAY_PORT", raising=False)
    assert TunerSettings().ray_port is None
    monkeypatch.setenv("TOPOTUNE_RAY_PORT", "6390")
    assert TunerSettings().ray_port == 6390

