"""Bounds on what one request may send: its body size, checked before anything reads the body.

A 10 MB JSON space used to be parsed, validated and only then refused (21 s); a body over the cap is now answered
413 as soon as its Content-Length (or, for a chunked body, its running byte count) says so.
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

MAX_BODY_BYTES = 1024 * 1024  # an inline space is at most 200,000 characters; nothing else we take is larger


def _too_large_body(limit: int) -> bytes:
    return json.dumps({"detail": [{"loc": ["body"], "type": "body_too_large",
                                   "msg": f"the request body is larger than {limit:,} bytes; send a space file's "
                                          "path (space_path) instead of a large inline space"}]}).encode()


class BodySizeLimitMiddleware:
    def __init__(self, app: ASGIApp, *, max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def _refuse(self, send: Send) -> None:
        body = _too_large_body(self.max_bytes)
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared > self.max_bytes:
                    await self._refuse(send)
                    return
        received = 0
        started = refused = False

        async def counted_receive() -> Message:
            """Past the cap: answer 413 now and tell the app the client went away (what it says is dropped)."""
            nonlocal received, refused
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    if not started and not refused:
                        refused = True
                        await self._refuse(send)
                    return {"type": "http.disconnect"}
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal started
            if refused:
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        await self.app(scope, counted_receive, tracked_send)
