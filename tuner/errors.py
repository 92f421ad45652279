"""Typed errors with a message a user can act on.

Every error names the field that is wrong and the fix, so the CLI and the API can show it as one line
(exit code 2 / HTTP 422) without a traceback.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import ValidationError

# A request field named inside a message or a fix, written `like.this`: each face renders it under its own name
# (the CLI as its flag, the API as its body field) through `TopotuneError.renamed`.
_FIELD_REF = re.compile(r"`([A-Za-z_][\w.]*)`")


class TopotuneError(Exception):
    """Base of every error topotune raises on purpose."""

    def __init__(self, message: str, *, field: str | None = None, fix: str | None = None) -> None:
        self.field = field
        self.fix = fix
        self.message = message
        super().__init__(self.user_message())

    def user_message(self) -> str:
        return f"{self.field}: {self.detail()}" if self.field else self.detail()

    def detail(self) -> str:
        """The message and its fix without the field: for a face that names the field beside it (an API 422's
        `loc`)."""
        return _plain(self.message) + (f" (fix: {_plain(self.fix)})" if self.fix else "")

    def renamed(self, names: Mapping[str, str]) -> TopotuneError:
        """The same error with request fields under a face's names (the CLI's flags, the API's body fields):
        the field itself (a nested field keeps its tail: `calibration.x` -> `--calibration: x`) and every
        `field` the message and the fix name. A name missing from `names` stays as it is."""
        out = type(self).__new__(type(self))  # not copy.copy: it re-calls __init__ with args alone (DoesNotFitError)
        out.__dict__.update(self.__dict__)
        out.field = rename_field(self.field, names) if self.field else self.field
        out.message = rename_refs(self.message, names)
        out.fix = rename_refs(self.fix, names) if self.fix else self.fix
        out.args = (out.user_message(),)
        return out


def _plain(text: str) -> str:
    return _FIELD_REF.sub(lambda m: m.group(1), text)


def rename_refs(text: str, names: Mapping[str, str]) -> str:
    """`text` with every `field` it names under a face's name (an error's message, or an answer's note such as
    `Advice.decided_by`)."""
    return _FIELD_REF.sub(lambda m: rename_field(m.group(1), names), text)


def rename_field(field: str, names: Mapping[str, str]) -> str:
    """`field` under a face's name: exact, else its longest named prefix and the rest after ": "."""
    if field in names:
        return names[field]
    parts = field.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        head = ".".join(parts[:cut])
        if head in names:
            return f"{names[head]}: {'.'.join(parts[cut:])}"
    return field


class ConfigError(TopotuneError):
    """An input (file, flag, field) is missing, malformed or out of range."""


def config_error(exc: ValidationError, prefix: str = "", *, fix: str | None = None) -> ConfigError:
    """A pydantic error as one ConfigError (the one reading of it): its first error, the field `prefix.loc` (or
    either alone), pydantic's message and the input it got; `fix` by default says to correct the field."""
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"])
    field = ".".join(part for part in (prefix, loc) if part) or "request"
    return ConfigError(f"{err['msg'].removeprefix('Value error, ')} (got {err.get('input')!r})", field=field,
                       fix=fix or f"correct `{field}`")


class UnsupportedModelError(ConfigError):
    """The model's architecture is unknown or its config lacks fields we need."""


class TopologyError(ConfigError):
    """A parallel layout that vLLM would refuse for this model or cluster."""


class InfeasibleError(ConfigError):
    """Constraints (SLA, GPU budget, pairing rules) leave no deployment; the message names the constraint."""


class DoesNotFitError(TopotuneError):
    """The weights and reserves leave no room for the KV cache a request needs."""

    def __init__(self, message: str, *, shortfall_gib: float, fix: str | None = None) -> None:
        self.shortfall_gib = shortfall_gib
        super().__init__(message, fix=fix)
