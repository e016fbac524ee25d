"""Signing in to the staff console (admin token, or staff email and password) and out."""

from __future__ import annotations

import hmac
import secrets

from aiohttp import web

from core.errors import AdminDisabled, ParleyError, RateLimited, Unauthorized
from gateway.admin.auth import DEVICE_COOKIE
from gateway.admin.console.render import (
    Route,
    admin,
    checked,
    form,
    redirect,
    render_bare,
    route,
    text,
)
from gateway.admin.guard import SIGN_IN_PAGE, after_sign_in
from gateway.client_address import client_address
from gateway.middlewares import status_for

# Nobody is signed in yet when the sign-in form is posted, so it carries a token of its own,
# also kept in a cookie (double submit): another site cannot sign a browser in to an
# account of its choosing.
FORM_COOKIE = "parley_sign_in"
FORM_FIELD = "form_token"
FORM_LIFETIME = 3600


async def _show(
    request: web.Request,
    *,
    next_path: str,
    error: str | None = None,
    status: int = 200,
    email: str = "",
    method: str = "token",
) -> web.Response:
    token = request.cookies.get(FORM_COOKIE) or secrets.token_urlsafe(24)
    response = render_bare(
        request,
        "admin/sign_in.html",
        status=status,
        title="Sign in",
        error=error,
        next_path=next_path,
        form_token=token,
        email=email,
        method=method,
        enabled=await admin(request).auth.enabled(),
    )
    response.set_cookie(
        FORM_COOKIE,
        token,
        max_age=FORM_LIFETIME,
        path=SIGN_IN_PAGE,
        httponly=True,
        secure=admin(request).auth.secure_cookies,
        samesite="Strict",
    )
    return response


async def sign_in_page(request: web.Request) -> web.StreamResponse:
    next_path = after_sign_in(request.query.get("next"))
    try:
        await admin(request).auth.authenticate(request)
    except ParleyError:
        return await _show(request, next_path=next_path)
    raise web.HTTPSeeOther(next_path)


async def sign_in(request: web.Request) -> web.StreamResponse:
    data = await form(request)
    raw_next = data.get("next")  # as sent: nothing trimmed before it is checked
    next_path = after_sign_in(raw_next if isinstance(raw_next, str) else None)
    expected = request.cookies.get(FORM_COOKIE, "")
    given = text(data, FORM_FIELD)
    if not expected or not hmac.compare_digest(given.encode(), expected.encode()):
        return await _show(
            request,
            next_path=next_path,
            status=403,
            error="This sign-in form has expired. Please try again.",
        )
    by_password = checked(data, "with_password") or bool(text(data, "email"))
    email = text(data, "email")
    try:
        signed_in = await admin(request).auth.sign_in(
            address=client_address(request),
            token=None if by_password else text(data, "token"),
            email=email if by_password else None,
            password=str(data.get("password", "")) if by_password else None,
            device=request.cookies.get(DEVICE_COOKIE),
        )
    except (Unauthorized, RateLimited, AdminDisabled) as exc:
        return await _show(
            request,
            next_path=next_path,
            status=status_for(exc),
            error=exc.message,
            email=email,
            method="password" if by_password else "token",
        )
    response = web.HTTPSeeOther(next_path)
    admin(request).auth.set_cookie(response, signed_in)
    response.del_cookie(FORM_COOKIE, path=SIGN_IN_PAGE)
    raise response


async def sign_out(request: web.Request) -> web.StreamResponse:
    auth = admin(request).auth
    await auth.sign_out(request)
    response = redirect(SIGN_IN_PAGE)
    auth.clear_cookie(response)
    raise response


def routes() -> list[Route]:
    return [
        route("GET", SIGN_IN_PAGE, sign_in_page, role=None),
        route("POST", SIGN_IN_PAGE, sign_in, role=None),
        route("POST", "/admin/sign-out", sign_out, role="agent"),
    ]
