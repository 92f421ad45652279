"""One Ray session per process: a local head (logical GPUs from the search space) or RAY_ADDRESS.

Starting Ray costs 7-9 s on a small machine, so every executor of a process shares the session this module
opens. Token authentication (on by default since Ray 2.59) stays on: a local head and this driver share the
token Ray keeps in ~/.ray/auth_token; a remote cluster's token must be given (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH
or ~/.ray/auth_token) and a missing or wrong one becomes a ConfigError that says so.

A local head's GCS binds a port of its own choosing (Ray's port 0, read back from the port file it writes), so no
other process can take the port between its choice and the bind; TOPOTUNE_RAY_PORT asks for a fixed one, which
must then be the head's own (a start that cannot have it fails with a ConfigError naming the setting).

A local head started here binds to loopback only (its GCS, raylet and agents; the dashboard is off), keeps the
process's own SIGTERM/SIGINT handlers (Ray's would exit at once, before a service can stop its trials
gracefully), and has a watchdog (tuner.executors._reaper) that stops every process it started when this process
dies, kill -9 included.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tuner.errors import ConfigError
from tuner.executors._reaper import HEAD_TAG_ENV

REDIS_PORT = 6379  # Redis holds it on our machines; Ray's own default
PORT_SETTING = "TOPOTUNE_RAY_PORT"
# How ray.init fails when a fixed GCS port was taken after the check, by what its error says -> why: the GCS could
# not bind it (a RuntimeError, after Ray's ~40 s wait when some other listener holds it), another Ray head's GCS
# holds it and the new head reached that one (an AssertionError: the session name in its store is the other head's;
# ray/_private/node.py), or, under python -O where that assert is gone, the new node never registers with the GCS
# that holds the port (a bare Exception after node.py's `raylet_start_wait_time_s`, 30 s).
_LOST_PORT = {
    "Failed to start GCS": "another process took it after it was checked",
    "does not match persisted value": "another process took it after it was checked",
    "timed out during startup": "Ray's node never registered with the GCS on it (another Ray head's, or a machine "
                                "too loaded for Ray's 30 s)",
}
LOOPBACK = "127.0.0.1"
OBJECT_STORE_BYTES = 200 * 2**20
NAMESPACE = "topotune"

_LOCK = threading.Lock()


@dataclass
class RaySession:
    address: str
    local: bool  # True when this process started the head
    num_gpus: int  # GPUs the cluster has (logical ones for a local head)


_SESSION: RaySession | None = None
_REAPER: subprocess.Popen | None = None


def _port_free(port: int) -> bool:
    """Whether `port` can be bound now: only to refuse a taken fixed port at once (Ray's own failure to bind it
    comes after a 40 s wait); a port taken after this check is caught after the start (_start_local)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def token_sources() -> list[str]:
    """Where Ray would find an auth token for this process (for error messages)."""
    found = []
    if os.environ.get("RAY_AUTH_TOKEN"):
        found.append("RAY_AUTH_TOKEN")
    path = os.environ.get("RAY_AUTH_TOKEN_PATH")
    if path and Path(path).is_file():
        found.append(f"RAY_AUTH_TOKEN_PATH={path}")
    if (Path.home() / ".ray" / "auth_token").is_file():
        found.append("~/.ray/auth_token")
    return found


def _cluster_gpus() -> int:
    import ray

    return int(ray.cluster_resources().get("GPU", 0))


def ensure_ray(*, address: str | None, num_gpus: int, port: int | None = None, num_cpus: int = 2) -> RaySession:
    """Connect to `address`, or start (or reuse) a local head declaring `num_gpus` logical GPUs, its GCS on
    `port` (TOPOTUNE_RAY_PORT; None: a port the GCS binds itself).

    A local head that declared fewer GPUs than now asked is restarted; a session someone else opened in this
    process (tests with ray.cluster_utils.Cluster) is reused as it is.
    """
    global _SESSION
    import ray

    with _LOCK:
        if ray.is_initialized():
            if _SESSION is None:  # opened by the caller (a test cluster, a notebook): use it as it is
                _SESSION = RaySession(address=ray.get_runtime_context().gcs_address, local=False,
                                      num_gpus=_cluster_gpus())
                return _SESSION
            if not (_SESSION.local and address is None and _SESSION.num_gpus < num_gpus):
                return _SESSION
            ray.shutdown()  # our local head is too small for this space: start a bigger one
            _SESSION = None
        local = address is None or address == ""
        if local and port is not None:
            _check_fixed_port(port)
        _SESSION = _start_local(num_gpus=num_gpus, port=port, num_cpus=num_cpus) if local else _connect(address)
        return _SESSION


def _port_error(port: int, why: str) -> ConfigError:
    return ConfigError(f"the local Ray head cannot have GCS port {port}: {why}", field=PORT_SETTING,
                       fix=f"unset {PORT_SETTING} (the head then binds a free port itself), choose another port, or "
                           f"set RAY_ADDRESS to the Ray cluster already running there")


def _check_fixed_port(port: int) -> None:
    if port == REDIS_PORT:
        raise _port_error(port, "it is Redis's port")
    if not _port_free(port):
        raise _port_error(port, "another process is listening on it")


def _quiet_init_kwargs() -> dict:
    return {"log_to_driver": False, "logging_level": logging.ERROR, "namespace": NAMESPACE,
            "include_dashboard": False}


@contextlib.contextmanager
def _own_signal_handlers() -> Iterator[None]:
    """ray.init installs SIGTERM handlers that exit the process at once; the caller's (uvicorn's graceful stop,
    the CLI's) are put back, so a SIGTERM reaches the code that fails in-flight trials as "driver stopped"."""
    if threading.current_thread() is not threading.main_thread():
        yield  # Ray cannot install handlers from here either
        return
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            if handler is not None and signal.getsignal(sig) is not handler:
                signal.signal(sig, handler)


def _start_reaper() -> str | None:
    """The watchdog of the head about to start, and the token the head's processes must carry (None: no watchdog
    here). Started before ray.init: a driver killed while ray.init starts the head's processes used to leave them
    with no watchdog (benchmarks/fault_injection.py --service: 1-2 processes left after a kill -9)."""
    global _REAPER
    if sys.platform != "linux":
        return None
    _stop_reaper()  # a previous head's, if any: this one watches the head that starts now
    token = uuid.uuid4().hex
    _REAPER = subprocess.Popen([sys.executable, "-m", "tuner.executors._reaper", str(os.getpid()), token],
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    return token


def _stop_reaper() -> None:
    global _REAPER
    if _REAPER is not None:
        with contextlib.suppress(OSError):
            _REAPER.terminate()
            _REAPER.wait(timeout=5)
        _REAPER = None


def _connect(address: str) -> RaySession:
    import ray
    from ray.exceptions import AuthenticationError

    kwargs = _quiet_init_kwargs()
    kwargs.pop("include_dashboard")
    sources = token_sources()
    have = ", ".join(sources) or "none found"
    try:
        with _own_signal_handlers():
            ray.init(address=address, **kwargs)
    except AuthenticationError as exc:
        raise ConfigError(f"the Ray cluster at {address} requires an authentication token and none was usable "
                          f"(token sources: {have}): {exc.message}", field="RAY_ADDRESS",
                          fix="copy the cluster's token (`ray get-auth-token` on the head) into ~/.ray/auth_token "
                              "or set RAY_AUTH_TOKEN / RAY_AUTH_TOKEN_PATH") from exc
    except ConnectionError as exc:
        raise ConfigError(f"cannot connect to the Ray cluster at {address}: {str(exc).splitlines()[0]}; if the "
                          f"cluster uses token authentication (the default since Ray 2.59) the token is missing or "
                          f"wrong (token sources: {have})", field="RAY_ADDRESS",
                          fix="check the address (host:port of the head's GCS) and the cluster's token") from exc
    return RaySession(address=address, local=False, num_gpus=_cluster_gpus())


def _start_local(*, num_gpus: int, port: int | None, num_cpus: int) -> RaySession:
    """A head bound to loopback, dashboard off, small store, and a watchdog that stops it when this process dies.
    Its GCS binds a free port itself (port None), or `port`; a port another process took after _check_fixed_port
    is a ConfigError: Ray's own failures (_LOST_PORT), or, should Ray go on (its check is an assert, which
    python -O drops), a cluster that is not this head's alone (_joined_own_head)."""
    import ray
    from ray._private import ray_constants

    token = _start_reaper()
    previous_tag = os.environ.get(HEAD_TAG_ENV)
    if token is not None:  # every process of the head inherits it: the watchdog finds them all (_reaper)
        os.environ[HEAD_TAG_ENV] = token
    previous = os.environ.get("RAY_GCS_SERVER_PORT")
    os.environ["RAY_GCS_SERVER_PORT"] = str(port or 0)  # Ray's 0: its GCS binds any free port and publishes it
    # Ray resolves 127.0.0.1 to the machine's address on Linux unless "clusters" are off (its switch is named for
    # Windows and macOS, where it is the default): off, the head, its agents and its workers all bind to loopback.
    previous_cluster = os.environ.get(ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR)
    os.environ[ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR] = "0"
    enable_cluster, ray_constants.ENABLE_RAY_CLUSTER = ray_constants.ENABLE_RAY_CLUSTER, False
    try:
        # address="local": always a new head; without it ray.init joins whatever cluster this machine started last
        with _own_signal_handlers():
            ctx = ray.init(address="local", num_cpus=num_cpus, num_gpus=num_gpus,
                           object_store_memory=OBJECT_STORE_BYTES, _node_ip_address=LOOPBACK,
                           **_quiet_init_kwargs())
    except Exception as exc:  # Ray raises a bare Exception when its node never registers (_LOST_PORT)
        _stop_reaper()
        why = next((why for sign, why in _LOST_PORT.items() if sign in str(exc)), None) if port is not None else None
        if why is None:
            raise
        with contextlib.suppress(Exception):  # what the failed start left running
            ray.shutdown()
        raise _port_error(port, f"{why} (Ray's error is chained to this one)") from exc
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = enable_cluster
        for name, value in (("RAY_GCS_SERVER_PORT", previous), (HEAD_TAG_ENV, previous_tag),
                            (ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR, previous_cluster)):
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    if port is not None and not _joined_own_head(ctx.address_info.get("node_id", "")):
        ray.shutdown()
        _stop_reaper()
        raise _port_error(port, "another Ray head's GCS took it since it was checked")
    return RaySession(address=ctx.address_info.get("gcs_address", ""), local=True, num_gpus=num_gpus)


def _joined_own_head(node_id: str) -> bool:
    """The cluster ray.init reached is the head it started: its GCS process runs, and no other node is there."""
    import ray
    from ray._private import ray_constants, worker

    node = worker._global_node
    gcs = node.all_processes.get(ray_constants.PROCESS_TYPE_GCS_SERVER, []) if node is not None else []
    return (bool(gcs) and gcs[0].process.poll() is None
            and {n["NodeID"] for n in ray.nodes() if n.get("Alive")} == {node_id})


def shutdown_ray() -> None:
    """Stop the session this module opened (a local head stops with it)."""
    global _SESSION
    import ray

    with _LOCK:
        if _SESSION is not None:
            with contextlib.suppress(Exception):
                ray.shutdown()
        _SESSION = None
        _stop_reaper()


def current_session() -> RaySession | None:
    return _SESSION


def forget_ray_session() -> None:
    """Forget the session without stopping Ray: for a caller that opened Ray itself (a test cluster) and has
    shut it down, so the next executor opens its own session instead of reusing a dead one."""
    global _SESSION
    with _LOCK:
        _SESSION = None
