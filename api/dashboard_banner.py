"""A one-line banner on the embedded Optuna dashboard's page saying whether its buttons can write, and why not.

The dashboard's bundle cannot send a token: signed out, its create/rename/note/delete calls get a 401 and it only
says "Failed to ...". The banner (inserted after <body> in its HTML page, nothing else touched) links to the
sign-in; signed in (session cookie), its mutations pass AuthMiddleware's Origin check.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.security import AuthState

_STYLE = ("position:fixed;bottom:0;left:0;right:0;z-index:9999;padding:6px 12px;font:14px system-ui,sans-serif;"
          "background:#fff3c4;border-top:1px solid #d9c27a;color:#333")
SIGNED_OUT = (f'<div id="topotune-banner" style="{_STYLE}">Read-only: creating, renaming, deleting studies and '
              'editing notes here need the service\'s token. <a href="/ui/login?next=/dashboard">Sign in</a> '
              '(then these buttons work), or use the API with <code>Authorization: Bearer</code>. '
              '<a href="/ui">topotune pages</a></div>')


class DashboardBanner:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        auth: AuthState | None = scope.get("state", {}).get("auth")
        wanted = (scope["type"] == "http" and scope["method"] == "GET" and auth is not None
                  and auth.via == "none" and scope["path"].startswith("/dashboard"))
        if not wanted:
            await self.app(scope, receive, send)
            return
        start: Message | None = None
        chunks: list[bytes] = []

        async def buffered(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                start = message
                return
            if message["type"] != "http.response.body" or start is None:
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body"):
                return
            await self._send_page(start, b"".join(chunks), send)

        await self.app(scope, receive, buffered)

    @staticmethod
    async def _send_page(start: Message, body: bytes, send: Send) -> None:
        headers = [(k, v) for k, v in start["headers"] if k.lower() != b"content-length"]
        is_html = any(k.lower() == b"content-type" and v.startswith(b"text/html") for k, v in headers)
        if is_html and start["status"] == 200 and b"<body>" in body:
            body = body.replace(b"<body>", b"<body>" + SIGNED_OUT.encode(), 1)
        await send({**start, "headers": [*headers, (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
