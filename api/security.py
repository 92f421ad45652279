"""Who may do what, as ASGI middleware in front of everything (the API, the pages and the embedded dashboard).

It runs before routing and body parsing, so every unauthenticated mutating call is refused with 401, whatever
its body. Two ways in:
- `Authorization: Bearer <token>` (API clients): accepted from anywhere, no CSRF question (a browser never
  attaches it by itself).
- the session cookie of a sign-in at /ui/login (browsers): HttpOnly, SameSite=Strict. A mutation carried by the
  cookie must also come from this origin (`Origin`, else `Referer`, naming this host) and, on our own routes
  (/v1, /ui), carry the session's `X-CSRF-Token`. The dashboard's bundle cannot send that header, so its
  /api mutations rest on the Origin check plus SameSite=Strict.
With auth off (a loopback dev server) everything is open except cross-origin mutations.
The outcome is left in scope["state"]["auth"] for the pages (signed in? which CSRF token?).
"""

from __future__ import annotations

import hmac
import json
from dataclasses import dataclass
from http.cookies import SimpleCookie
from urllib.parse import quote, urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from api.sessions import CSRF_HEADER, SESSION_COOKIE, Session, SessionSigner

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
ALWAYS_OPEN = frozenset({"/healthz"})
SIGN_IN_PATH = "/ui/login"  # checks the token itself (form post) and must stay reachable with read_auth
CSRF_TOKEN_PREFIXES = ("/v1/", "/ui/")


@dataclass(frozen=True)
class AuthState:
    """What the request proved: "bearer", "session", "open" (auth off) or "none"."""

    via: str
    session: Session | None = None

    @property
    def csrf_token(self) -> str:
        return self.session.csrf_token if self.session else ""

    @property
    def can_mutate(self) -> bool:
        return self.via in ("bearer", "session", "open")


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return value.decode("latin-1")
    return None


def session_of(scope: Scope, signer: SessionSigner | None) -> Session | None:
    raw = _header(scope, b"cookie")
    if signer is None or not raw:
        return None
    cookie = SimpleCookie()
    try:
        cookie.load(raw)
    except Exception:  # a malformed Cookie header is no session
        return None
    morsel = cookie.get(SESSION_COOKIE)
    return signer.verify(morsel.value) if morsel is not None else None


def same_origin(scope: Scope, *, allow_missing: bool) -> bool:
    """Origin (or, when absent, Referer) names this host. Compared on host[:port]: behind a TLS-terminating proxy
    the scheme the browser saw is not the one we see."""
    host = _header(scope, b"host")
    origin = _header(scope, b"origin") or _header(scope, b"referer")
    if not origin or origin == "null":
        return allow_missing and origin is None
    return host is not None and urlsplit(origin).netloc == host


async def refuse(send: Send, status: int, loc: list[str], msg: str, *, kind: str,
                 headers: list[tuple[bytes, bytes]] | None = None) -> None:
    body = json.dumps({"detail": [{"loc": loc, "type": kind, "msg": msg}]}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *(headers or [])]})
    await send({"type": "http.response.body", "body": body})


class AuthMiddleware:
    def __init__(self, app: ASGIApp, *, token: str | None, read_auth: bool, signer: SessionSigner | None) -> None:
        self.app = app
        self.token = token.encode() if token else None
        self.read_auth = read_auth
        self.signer = signer

    def _bearer(self, scope: Scope) -> bool | None:
        """True/False for a right/wrong Authorization header, None when there is none."""
        value = _header(scope, b"authorization")
        if value is None:
            return None
        scheme, _, given = value.encode("latin-1").partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), self.token or b"")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        unsafe = scope["method"] not in SAFE_METHODS
        if self.token is None:
            state["auth"] = AuthState("open")
            if unsafe and not same_origin(scope, allow_missing=True):
                await refuse(send, 403, ["header", "origin"], "cross-origin mutation refused", kind="csrf")
                return
            await self.app(scope, receive, send)
            return
        bearer = self._bearer(scope)
        session = session_of(scope, self.signer) if bearer is None else None
        state["auth"] = AuthState("bearer" if bearer else "session" if session else "none", session)
        path = scope["path"]
        if path in ALWAYS_OPEN or path == SIGN_IN_PATH or bearer:
            await self.app(scope, receive, send)
            return
        if session is not None:
            problem = self._csrf_problem(scope, session) if unsafe else None
            if problem is not None:
                await refuse(send, 403, problem[0], problem[1], kind="csrf")
                return
            await self.app(scope, receive, send)
            return
        if not unsafe and not self.read_auth:
            await self.app(scope, receive, send)
            return
        await self._unauthorized(scope, send, wrong=bearer is False)

    @staticmethod
    def _csrf_problem(scope: Scope, session: Session) -> tuple[list[str], str] | None:
        if not same_origin(scope, allow_missing=False):
            return ["header", "origin"], ("a mutation with the session cookie must come from this site's pages "
                                          "(Origin or Referer naming this host); API clients send a bearer token")
        if scope["path"].startswith(CSRF_TOKEN_PREFIXES):
            given = _header(scope, CSRF_HEADER.encode()) or ""
            if not hmac.compare_digest(given.encode(), session.csrf_token.encode()):
                return ["header", CSRF_HEADER], ("missing or wrong X-CSRF-Token: send the token of the page "
                                                 "(meta csrf-token); reload the page after signing in again")
        return None

    async def _unauthorized(self, scope: Scope, send: Send, *, wrong: bool) -> None:
        """401 naming both ways in; a browser asking for a page (read_auth) is sent to the sign-in instead."""
        accept = _header(scope, b"accept") or ""
        if scope["method"] == "GET" and "text/html" in accept:
            target = scope["path"] + (f"?{scope['query_string'].decode('latin-1')}" if scope["query_string"] else "")
            await send({"type": "http.response.start", "status": 303,
                        "headers": [(b"location", f"{SIGN_IN_PATH}?next={quote(target, safe='')}".encode()),
                                    (b"content-length", b"0")]})
            await send({"type": "http.response.body", "body": b""})
            return
        msg = ("wrong bearer token" if wrong else "not signed in (or the session expired)") + (
            ": send `Authorization: Bearer <TOPOTUNE_API_TOKEN>`, or sign in at /ui/login in a browser "
            "(the Optuna dashboard's buttons work once signed in)")
        await refuse(send, 401, ["header", "authorization"], msg, kind="unauthorized",
                     headers=[(b"www-authenticate", b"Bearer")])
