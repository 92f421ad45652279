"""One error shape for the whole API: FastAPI's 422 body ({"detail": [{"loc", "msg", "type"}]}) names the field."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import JSONResponse


class FieldError(Exception):
    """A request that passed the schema but cannot be served as asked: 422 naming the field (or 404/409)."""

    def __init__(self, loc: tuple[str | int, ...], message: str, *, status_code: int = 422,
                 kind: str = "value_error") -> None:
        super().__init__(message)
        self.loc = loc
        self.message = message
        self.status_code = status_code
        self.kind = kind


class NotFound(FieldError):
    def __init__(self, what: str, ident: object) -> None:
        super().__init__(("path", "id"), f"no {what} {ident}", status_code=404, kind="not_found")


async def field_error_handler(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, FieldError)
    return JSONResponse(status_code=exc.status_code,
                        content={"detail": [{"loc": list(exc.loc), "msg": exc.message, "type": exc.kind}]})
