"""Opening a file a user or a client names, whatever it turns out to be.

A path may name a directory, a FIFO (open blocks for ever), /dev/zero (reads never end), a socket, or a regular
file far larger than anything topotune reads. Every input file (a trace, a workload or search-space YAML) goes
through `open_regular` / `read_text`: the path must be a regular file under its size bound, checked with stat
before opening and again on the open descriptor (opened non-blocking, so a FIFO swapped in between cannot
block), and text is decoded as UTF-8 with an error naming the line. Each refusal is a ConfigError naming the
field and the fix (exit 2 in the CLI, 422 in the service).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from tuner.errors import ConfigError

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _check(path: Path, st: os.stat_result, *, max_bytes: int, field: str, fix: str, what: str) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{path} is {_kind(st.st_mode)}, not a regular file", field=field,
                          fix=f"give the path of {what}")
    if st.st_size > max_bytes:
        raise ConfigError(f"{path.name} is {_size(st.st_size)}; at most {_size(max_bytes)} is read", field=field,
                          fix=fix)


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n:,} bytes"


@contextlib.contextmanager
def open_regular(path: Path | str, *, max_bytes: int, field: str, fix: str, what: str) -> Iterator[BinaryIO]:
    """The file opened for binary reading, if it is a regular file of at most `max_bytes` (ConfigError else).

    `what` names the expected file ("a mooncake-format JSONL trace"), `fix` says how to make a too-large one
    smaller."""
    path = Path(path)
    try:
        _check(path, os.stat(path), max_bytes=max_bytes, field=field, fix=fix, what=what)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}", field=field, fix=f"give the path of {what}") from exc
    try:
        _check(path, os.fstat(fd), max_bytes=max_bytes, field=field, fix=fix, what=what)  # swapped since stat?
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        handle = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with handle:
        yield handle


def decode_utf8(data: bytes, path: Path | str, *, field: str, first_line: int = 1) -> str:
    """`data` as UTF-8, or a ConfigError naming the line (counted from `first_line`) and the bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = first_line + data.count(b"\n", 0, exc.start)
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise ConfigError(f"{Path(path).name} line {line}, column {column}: byte 0x{data[exc.start]:02x} is not "
                          "UTF-8", field=field, fix="save the file as UTF-8 (e.g. iconv -t UTF-8)") from None


def read_text(path: Path | str, *, max_bytes: int, field: str, fix: str, what: str) -> str:
    """The whole file as UTF-8 text: a regular file of at most `max_bytes`, decoded with an error naming the
    line (a file that grows past the bound while read is refused too)."""
    with open_regular(path, max_bytes=max_bytes, field=field, fix=fix, what=what) as handle:
        try:
            data = handle.read(max_bytes + 1)
        except OSError as exc:
            raise ConfigError(f"cannot read {path}: {exc.strerror}", field=field,
                              fix=f"give the path of {what}") from exc
    if len(data) > max_bytes:
        raise ConfigError(f"{Path(path).name} is larger than {_size(max_bytes)}", field=field, fix=fix)
    return decode_utf8(data, path, field=field)
