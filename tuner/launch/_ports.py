"""The ports a trial's servers bind: a block free when chosen, the log line that says another process took one of
them before the server bound it, and the one loop that starts the servers again on a fresh block when it did."""

from __future__ import annotations

import random
import socket
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

PORT_ATTEMPTS = 5  # starts, each on a fresh block, before servers that keep losing a port are given up on


class PortsLost(RuntimeError):
    """Every start lost a port of its block to another process before its server bound it."""


def start_on_free_ports(start: Callable[[int, int], T], *, ports: int, logs: Callable[[int], Iterable[str]],
                        where: str | Path, attempts: int = PORT_ATTEMPTS, base: int | None = None) -> T:
    """What `start(base, attempt)` returns: the servers it started on ports base .. base+ports-1, healthy.

    `base` is a fresh free_port_block at each attempt (0 first). A port free when chosen can still be taken by
    another process before the server binds it (the servers bind as they start, seconds later): when `start`
    raises and `logs(attempt)`, the texts of that start's logs, show lost_port, it is called again on a fresh
    block, up to `attempts` starts, then PortsLost says so and `where` the logs are. `start` stops what it started
    before it raises, or leaves that to its caller's teardown (then it stops a lost start's servers as it begins
    the next). Any other failure is raised as it is, and so is any failure on a `base` the caller fixed (a user's
    port_base is used as given: one start, never moved)."""
    if base is not None:
        return start(base, 0)
    lost: Exception | None = None
    for attempt in range(attempts):
        try:
            return start(free_port_block(ports), attempt)
        except Exception as exc:
            if not any(lost_port(text) for text in logs(attempt)):
                raise
            lost = exc
    raise PortsLost(f"another process took a port before the server bound it, {attempts} starts in a row, each on a "
                    f"fresh block of {ports}: logs in {where}") from lost


def free_port_block(count: int, *, start: int = 20000, end: int = 60000, host: str = "127.0.0.1") -> int:
    """A port P such that P .. P+count-1 are all free to bind now (avoids 5432, 6379 by range). The scan starts at
    a random block of the range and wraps: two trials choosing at once (each binds its ports only when its
    servers start) would both find the range's first free block. It stays below the kernel's ephemeral ports, which
    every outgoing connection (a benchmark client's, Ray's) takes one of, and so could take one of ours meanwhile."""
    if start + count <= (low := _ephemeral_low()):
        end = min(end, low)
    blocks = (end - start) // count
    first = random.SystemRandom().randrange(blocks) if blocks > 0 else 0
    for index in range(blocks):
        base = start + ((first + index) % blocks) * count
        if all(_bindable(host, port) for port in range(base, base + count)):
            return base
    raise RuntimeError(f"no block of {count} free ports in [{start}, {end})")


def lost_port(log_text: str) -> bool:
    """The log shows a bind that failed because the port was taken (EADDRINUSE): Python's "[Errno 98] Address
    already in use", Go's and Rust's "address already in use". A port from free_port_block was free when chosen;
    another process can still take it before the server binds it (start_on_free_ports then starts again)."""
    return "address already in use" in log_text.lower()


def _ephemeral_low(ranges: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> int:
    """The first port the kernel hands out for connections and port-0 binds (Linux's default 32768)."""
    try:
        return int(ranges.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True
