"""The embedded Optuna dashboard is read-only inside topotune, and answers 404 (not 500) for a study it lacks.

Its studies are topotune's phase studies: a rename, a delete, a note or a `tell` through the dashboard's own API
changed them behind topotune's back (a renamed phase study left topotune's pages serving a cached front), and the
dashboard's bundle cannot carry topotune's CSRF token. So every method but GET and HEAD under the mount is
answered 405 with why and what to use instead, whoever asks (signed in, with the token, or not). Of its reads, a
plot of an unknown study id raised KeyError (a 500): ids under /api/studies/<id>/ are checked first.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from fastapi.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Receive, Scope, Send

READ_METHODS = frozenset({"GET", "HEAD"})
READ_ONLY = ("the embedded Optuna dashboard is read-only inside topotune: its studies are topotune's phase "
             "studies, and renaming, deleting, noting or telling them here would change them behind topotune's "
             "back; use topotune's API (/v1/studies, Authorization: Bearer) or pages (/ui)")
_STUDY_PATH = re.compile(r"^/api/studies/(\d+)/")


class DashboardGuard:
    """Wraps the dashboard's ASGI app: writes refused with 405, unknown study ids answered 404."""

    def __init__(self, app: ASGIApp, study_exists: Callable[[int], bool]) -> None:
        self.app = app
        self.study_exists = study_exists

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["method"] not in READ_METHODS:
            await _answer(send, 405, {"reason": f"{scope['method']} {scope['path']}: {READ_ONLY}"},
                          [(b"allow", b"GET, HEAD")])
            return
        found = _STUDY_PATH.match(scope["path"])
        if found and not await run_in_threadpool(self.study_exists, int(found.group(1))):
            await _answer(send, 404, {"reason": f"study_id={found.group(1)} is not found"})
            return
        await self.app(scope, receive, send)


async def _answer(send: Send, status: int, body: dict, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                            *(headers or [])]})
    await send({"type": "http.response.body", "body": data})
