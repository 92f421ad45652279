"""One error shape for the whole API: FastAPI's 422 body ({"detail": [{"loc", "msg", "type"}]}) names the field."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from fastapi import Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from tuner.errors import TopotuneError


class FieldError(Exception):
    """A request that passed the schema but cannot be served as asked: 422 naming the field (or 404/409)."""

    def __init__(self, loc: tuple[str | int, ...], message: str, *, status_code: int = 422,
                 kind: str = "value_error") -> None:
        super().__init__(message)
        self.loc = loc
        self.message = message
        self.status_code = status_code
        self.kind = kind

    @classmethod
    def of(cls, loc: tuple[str | int, ...], exc: TopotuneError) -> FieldError:
        """A library error at `loc`, its field named once: by `loc` when `loc` ends with it (the message and the
        fix alone), else in the message too (a field inside the one `loc` names, `constraints.x` of a space)."""
        field = (exc.field or "").replace(": ", ".").split(".")
        carried = bool(exc.field) and [str(p) for p in loc[-len(field):]] == field
        return cls(loc, exc.detail() if carried else exc.user_message())

    @classmethod
    def in_body(cls, exc: TopotuneError, names: Mapping[str, str], unnamed: str = "body") -> FieldError:
        """A library error as a 422 at the body field it names, its request fields under the body's `names`; an
        error naming no field (a deployment that does not fit) at `unnamed`."""
        named = exc.renamed(names)
        loc = tuple((named.field or unnamed).replace(": ", ".").split("."))
        return cls.of(("body", *loc), named)


class NotFound(FieldError):
    def __init__(self, what: str, ident: object) -> None:
        super().__init__(("path", "id"), f"no {what} {ident}", status_code=404, kind="not_found")


async def field_error_handler(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, FieldError)
    return JSONResponse(status_code=exc.status_code,
                        content={"detail": [{"loc": list(exc.loc), "msg": exc.message, "type": exc.kind}]})


def _json_safe(value: Any) -> Any:
    """JSON has no inf/NaN: `"trials": 1e400` arrives as inf and used to crash the 422 itself (a 500)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


async def validation_error_handler(_request: Request, exc: Exception) -> JSONResponse:
    """FastAPI's own 422 shape, with every echoed input made JSON-safe."""
    assert isinstance(exc, RequestValidationError)
    return JSONResponse(status_code=422, content={"detail": _json_safe(jsonable_encoder(exc.errors()))})
