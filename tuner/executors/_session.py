"""One Ray session per process: a local head (logical GPUs from the search space) or RAY_ADDRESS.

Starting Ray costs 7-9 s on a small machine, so every executor of a process shares the session this module
opens. Token authentication (on by default since Ray 2.59) stays on: a local head and this driver share the
token Ray keeps in ~/.ray/auth_token; a remote cluster's token must be given (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH
or ~/.ray/auth_token) and a missing or wrong one becomes a ConfigError that says so.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from dataclasses import dataclass
from pathlib import Path

from tuner.errors import ConfigError

REDIS_PORT = 6379  # Redis holds it on our machines; Ray's own default
OBJECT_STORE_BYTES = 200 * 2**20
NAMESPACE = "topotune"

_LOCK = threading.Lock()


@dataclass
class RaySession:
    address: str
    local: bool  # True when this process started the head
    num_gpus: int  # GPUs the cluster has (logical ones for a local head)


_SESSION: RaySession | None = None


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))
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


def ensure_ray(*, address: str | None, num_gpus: int, port: int = 6390, num_cpus: int = 2) -> RaySession:
    """Connect to `address`, or start (or reuse) a local head declaring `num_gpus` logical GPUs.

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
        _SESSION = _start_local(num_gpus=num_gpus, port=port, num_cpus=num_cpus) if local else _connect(address)
        return _SESSION


def _quiet_init_kwargs() -> dict:
    return {"log_to_driver": False, "logging_level": logging.ERROR, "namespace": NAMESPACE,
            "include_dashboard": False}


def _connect(address: str) -> RaySession:
    import ray
    from ray.exceptions import AuthenticationError

    kwargs = _quiet_init_kwargs()
    kwargs.pop("include_dashboard")
    sources = token_sources()
    have = ", ".join(sources) or "none found"
    try:
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


def _start_local(*, num_gpus: int, port: int, num_cpus: int) -> RaySession:
    """A head on `port` (never Redis's 6379; a random free port when taken), dashboard off, small store."""
    import ray

    chosen = port if port != REDIS_PORT and _port_free(port) else 0
    previous = os.environ.get("RAY_GCS_SERVER_PORT")
    os.environ["RAY_GCS_SERVER_PORT"] = str(chosen)
    try:
        # address="local": always a new head; without it ray.init joins whatever cluster this machine started last
        ctx = ray.init(address="local", num_cpus=num_cpus, num_gpus=num_gpus, object_store_memory=OBJECT_STORE_BYTES,
                       **_quiet_init_kwargs())
    finally:
        if previous is None:
            os.environ.pop("RAY_GCS_SERVER_PORT", None)
        else:
            os.environ["RAY_GCS_SERVER_PORT"] = previous
    return RaySession(address=ctx.address_info.get("gcs_address", ""), local=True, num_gpus=num_gpus)


def shutdown_ray() -> None:
    """Stop the session this module opened (a local head stops with it)."""
    global _SESSION
    import ray

    with _LOCK:
        if _SESSION is not None:
            with contextlib.suppress(Exception):
                ray.shutdown()
        _SESSION = None


def current_session() -> RaySession | None:
    return _SESSION


def forget_ray_session() -> None:
    """Forget the session without stopping Ray: for a caller that opened Ray itself (a test cluster) and has
    shut it down, so the next executor opens its own session instead of reusing a dead one."""
    global _SESSION
    with _LOCK:
        _SESSION = None
