"""Client paths are confined to the configured roots: no `..`, symlinks resolved before the check.

Paths only ever reach the filesystem through Path APIs (stat, read_text); nothing a client sends reaches a shell.
"""

from __future__ import annotations

from pathlib import Path

from api.errors import FieldError

MAX_PATH_CHARS = 4096


def confine(raw: str, roots: list[Path], *, base: Path, loc: tuple[str, ...]) -> Path:
    """The resolved path of `raw` (relative ones against `base`) if it lies under a root, else a 422 on `loc`."""
    if not raw or "\x00" in raw or len(raw) > MAX_PATH_CHARS:
        raise FieldError(loc, "not a usable path")
    given = Path(raw)
    if ".." in given.parts:
        raise FieldError(loc, "`..` is not allowed in paths")
    allowed = [r.resolve(strict=False) for r in roots]
    outside = FieldError(loc, "the path is outside the allowed roots (TOPOTUNE_ALLOWED_ROOTS): "
                              + ", ".join(str(r) for r in allowed), kind="path_not_allowed")
    lexical = given if given.is_absolute() else base / given
    try:
        resolved = lexical.resolve(strict=False)
    except (OSError, RuntimeError) as exc:  # a symlink loop: outside the roots is answered the same either way
        if not _under(lexical, allowed):
            raise outside from None
        raise FieldError(loc, f"cannot resolve the path: {exc}") from exc
    # The answer for a path outside the roots is decided before anything looks at the file itself, so it is the
    # same whether the file exists, is a FIFO or a device, or cannot be stat-ed.
    if not _under(resolved, allowed):
        raise outside
    try:
        resolved.exists()  # resolve() tolerates a name the filesystem refuses (a part over 255 bytes); stat does not
    except OSError as exc:
        raise FieldError(loc, f"cannot resolve the path: {exc}") from exc
    return resolved


def no_such_trace(raw: str, base: Path, loc: tuple[str, ...]) -> FieldError:
    """A trace that is not there, with where a relative one is looked for (the space's folder, not the models
    dir a `model_path` starts from)."""
    return FieldError(loc, f"no such trace file: {raw} (fix: a relative trace path starts at {base}; give a path "
                           "there, or an absolute one under TOPOTUNE_ALLOWED_ROOTS)")


def _under(path: Path, roots: list[Path]) -> bool:
    return any(path == r or path.is_relative_to(r) for r in roots)
