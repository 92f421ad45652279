"""A one-line banner on the embedded Optuna dashboard's page saying that it is read-only, and why.

Its create/rename/note/delete buttons are refused inside topotune (api/dashboard_guard.py: 405 for every write),
and the dashboard itself only says "Failed to ...". The banner (inserted after <body> in its HTML page, nothing
else touched) says why and links to topotune's own pages.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.security import AuthState

_STYLE = ("position:fixed;bottom:0;left:0;right:0;z-index:9999;padding:6px 12px;font:14px system-ui,sans-serif;"
          "background:#fff3c4;border-top:1px solid #d9c27a;color:#333")
READ_ONLY_BANNER = (f'<div id="topotune-banner" style="{_STYLE}">Read-only inside topotune: these studies are '
                    "topotune's phase studies, so creating, renaming, deleting and editing notes here are refused. "
                    'Start, cancel and re-verify studies on <a href="/ui">topotune\'s pages</a> or with its API '
                    '(<code>/v1/studies</code>). A topotune trial is one configuration measured at several loads: '
                    "one row here, its values those of the load it was told with (<code>load_level</code>), every "
                    "load's metrics in <code>load_levels</code>. (In a study stored before that, a row whose "
                    "<code>kind</code> is <code>extra</code> is the load <code>load_level</code> of trial "
                    "<code>parent_trial</code>.)</div>")


class DashboardBanner:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        auth: AuthState | None = scope.get("state", {}).get("auth")
        wanted = (scope["type"] == "http" and scope["method"] == "GET" and auth is not None
                  and scope["path"].startswith("/dashboard"))
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
            body = body.replace(b"<body>", b"<body>" + READ_ONLY_BANNER.encode(), 1)
        await send({**start, "headers": [*headers, (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
