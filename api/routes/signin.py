"""/ui/login and /ui/logout: a browser trades the API token for a signed session cookie (see api.sessions).

The sign-in is a plain HTML form (works without JavaScript); its POST is open in AuthMiddleware because it checks
the token itself. Cookie: HttpOnly (scripts never see it), SameSite=Strict (never sent by another site's request),
Path=/, Max-Age = TOPOTUNE_SESSION_HOURS, Secure over https (or TOPOTUNE_COOKIE_SECURE).
"""

from __future__ import annotations

from typing import Annotated
from urllib.parse import parse_qs

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from api.deps import SettingsDep
from api.routes.pages import TEMPLATES
from api.security import AuthState, same_origin
from api.sessions import SESSION_COOKIE, SessionSigner

router = APIRouter(prefix="/ui", tags=["pages"], include_in_schema=False)
MAX_FORM_BYTES = 8 * 1024


def safe_next(target: str | None) -> str:
    """Only a path of this site (never `//host` or a scheme): the sign-in must not be an open redirect."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/ui"
    return target


def _page(request: Request, status_code: int, *, error: str | None = None, next_url: str = "/ui") -> HTMLResponse:
    return TEMPLATES.TemplateResponse(request, "login.html", {"error": error, "next_url": next_url,
                                                              "auth_on": request.app.state.signer is not None},
                                      status_code=status_code)


@router.get("/login", response_class=HTMLResponse)
def login_page(request: Request, next_url: Annotated[str | None, Query(alias="next")] = None) -> HTMLResponse:
    return _page(request, 200, next_url=safe_next(next_url))


@router.post("/login", response_class=HTMLResponse)
async def login(request: Request, settings: SettingsDep) -> Response:
    signer: SessionSigner | None = request.app.state.signer
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            return _page(request, 413, error=f"the sign-in form is limited to {MAX_FORM_BYTES} bytes")
    form = parse_qs(body.decode("utf-8", "replace"), max_num_fields=4)
    next_url = safe_next((form.get("next") or [None])[0])
    if not same_origin(request.scope, allow_missing=True):
        return _page(request, 403, error="sign-in refused: the form was posted from another site", next_url=next_url)
    if signer is None:
        return RedirectResponse(next_url, status_code=303)  # auth is off: nothing to sign in to
    token = (form.get("token") or [""])[0].strip()
    if not token or not signer.check_token(token):
        return _page(request, 401, error="wrong token: paste the value of TOPOTUNE_API_TOKEN the service was "
                                         "started with", next_url=next_url)
    cookie, _session = signer.issue()
    response = RedirectResponse(next_url, status_code=303)
    secure = settings.cookie_secure if settings.cookie_secure is not None else request.url.scheme == "https"
    response.set_cookie(SESSION_COOKIE, cookie, max_age=int(signer.lifetime_s), path="/", httponly=True,
                        samesite="strict", secure=secure)
    return response


@router.post("/logout")
def logout(request: Request) -> JSONResponse:
    """Needs the session and its CSRF token (AuthMiddleware); ends the session in this process and clears it."""
    auth: AuthState = request.state.auth
    signer: SessionSigner | None = request.app.state.signer
    if signer is not None and auth.session is not None:
        signer.revoke(auth.session)
    response = JSONResponse({"signed_in": False})
    response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict")
    return response
