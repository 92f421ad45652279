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
    try:
        resolved = (given if given.is_absolute() else base / given).resolve(strict=False)
        allowed = [r.resolve(strict=False) for r in roots]
        resolved.exists()  # resolve() tolerates a name the filesystem refuses (a part over 255 bytes); stat does not
    except (OSError, RuntimeError) as exc:  # symlink loops, names too long
        raise FieldError(loc, f"cannot resolve the path: {exc}") from exc
    if not any(resolved == r or resolved.is_relative_to(r) for r in allowed):
        raise FieldError(loc, "the path is outside the allowed roots (TOPOTUNE_ALLOWED_ROOTS): "
                              + ", ".join(str(r) for r in allowed), kind="path_not_allowed")
    return resolved
