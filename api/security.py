"""Bearer-token check as ASGI middleware, in front of everything (the API, the pages and the embedded dashboard).

It runs before routing and body parsing, so every unauthenticated mutating call is refused with 401, whatever
its body (the dashboard's own POST/PUT/DELETE API included: without the token it is read-only).
"""

from __future__ import annotations

import hmac
import json

from starlette.types import ASGIApp, Receive, Scope, Send

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
ALWAYS_OPEN = frozenset({"/healthz"})


class BearerAuthMiddleware:
    def __init__(self, app: ASGIApp, *, token: str | None, read_auth: bool) -> None:
        self.app = app
        self.token = token.encode() if token else None
        self.read_auth = read_auth

    def _allowed(self, scope: Scope) -> bool:
        for name, value in scope.get("headers", []):
            if name == b"authorization":
                scheme, _, given = value.partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), self.token or b"")
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.token is None or scope["path"] in ALWAYS_OPEN:
            await self.app(scope, receive, send)
            return
        needs = scope["method"] not in SAFE_METHODS or self.read_auth
        if not needs or self._allowed(scope):
            await self.app(scope, receive, send)
            return
        body = json.dumps({"detail": [{"loc": ["header", "authorization"], "type": "unauthorized",
                                       "msg": "send `Authorization: Bearer <TOPOTUNE_API_TOKEN>`"}]}).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
