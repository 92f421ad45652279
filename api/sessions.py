"""Browser sessions signed with the API token: a sign-in turns the bearer token into an HttpOnly cookie.

The cookie holds no secret, only `v1.<expiry>.<nonce>.<signature>`, signed with a key derived from
TOPOTUNE_API_TOKEN: nothing is stored server-side, a session survives a restart, and rotating the token ends
every session at once. Each session has its own CSRF token (an HMAC of its nonce), which the pages send as
`X-CSRF-Token` on mutations. Sign-out revokes the nonce in this process (and the cookie is cleared).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import threading
import time
from dataclasses import dataclass

SESSION_COOKIE = "topotune_session"
CSRF_HEADER = "x-csrf-token"
_VERSION = "v1"
_MAX_REVOKED = 10_000


@dataclass(frozen=True)
class Session:
    nonce: str
    expires_at: float  # unix seconds
    csrf_token: str


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class SessionSigner:
    """Issues and checks session cookies for one API token."""

    def __init__(self, token: str, lifetime_s: float) -> None:
        self._key = hmac.new(token.encode(), b"topotune-session-key", hashlib.sha256).digest()
        self.lifetime_s = lifetime_s
        self._revoked: dict[str, float] = {}  # nonce -> expiry (pruned as they expire)
        self._lock = threading.Lock()

    def _sign(self, payload: str) -> str:
        return _b64(hmac.new(self._key, payload.encode(), hashlib.sha256).digest())

    def csrf_for(self, nonce: str) -> str:
        return _b64(hmac.new(self._key, b"csrf." + nonce.encode(), hashlib.sha256).digest())

    def check_token(self, given: str) -> bool:
        """Is `given` the API token? (compared through the derived key, in constant time)"""
        derived = hmac.new(given.encode(), b"topotune-session-key", hashlib.sha256).digest()
        return hmac.compare_digest(derived, self._key)

    def issue(self, now: float | None = None) -> tuple[str, Session]:
        """(cookie value, session) for a new sign-in."""
        expires = int((now if now is not None else time.time()) + self.lifetime_s)
        nonce = secrets.token_urlsafe(18)
        payload = f"{_VERSION}.{expires}.{nonce}"
        return f"{payload}.{self._sign(payload)}", Session(nonce, float(expires), self.csrf_for(nonce))

    def verify(self, cookie: str, now: float | None = None) -> Session | None:
        """The session of a cookie value, or None when it is malformed, forged, expired or revoked."""
        parts = cookie.split(".")
        if len(parts) != 4 or parts[0] != _VERSION or not parts[1].isdigit():
            return None
        payload = ".".join(parts[:3])
        if not hmac.compare_digest(self._sign(payload), parts[3]):
            return None
        expires, nonce = float(parts[1]), parts[2]
        if expires <= (now if now is not None else time.time()):
            return None
        with self._lock:
            if nonce in self._revoked:
                return None
        return Session(nonce, expires, self.csrf_for(nonce))

    def revoke(self, session: Session) -> None:
        now = time.time()
        with self._lock:
            self._revoked = {n: e for n, e in self._revoked.items() if e > now}
            if len(self._revoked) < _MAX_REVOKED:
                self._revoked[session.nonce] = session.expires_at
