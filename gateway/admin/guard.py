"""The one gate in front of every staff route: authenticate, check CSRF, remember who it was;
and, for a request that lasts (an event stream, a long poll), look again every few seconds."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar
from urllib.parse import quote, urlsplit

from aiohttp import web
from aiohttp.typedefs import Handler

from channels.web import ERROR_HEADERS
from core.errors import Unauthorized
from core.store.staff import Role
from gateway.admin.auth import STAFF
from gateway.keys import ADMIN

log = logging.getLogger(__name__)
T = TypeVar("T")

CONSOLE_PREFIX = "/admin"
API_PREFIX = "/api/v1/admin"
SIGN_IN_PAGE = "/admin/sign-in"
# How often a long-lived staff request checks that it is still allowed (`while_allowed`).
RECHECK_SECONDS = 2.0
# Routes anyone may reach: the sign-in page and endpoint, and the console's static files.
PUBLIC_ROUTES = frozenset({SIGN_IN_PAGE, f"{API_PREFIX}/sign-in"})
PUBLIC_PREFIXES = ("/admin/static",)


def _is_under(route: str, prefix: str) -> bool:
    return route == prefix or route.startswith(prefix + "/")


def guarded(route: str) -> bool:
    """Whether a route (its template, e.g. ``/api/v1/admin/agents/{agent}``) needs staff."""
    if route in PUBLIC_ROUTES or any(_is_under(route, p) for p in PUBLIC_PREFIXES):
        return False
    return _is_under(route, CONSOLE_PREFIX) or _is_under(route, API_PREFIX)


@web.middleware
async def admin_guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Let staff through to guarded routes; everyone else gets 401 (or the sign-in page).

    Decided on the matched route's template rather than the raw path, so no spelling of a
    URL (double slashes, encoded characters) reaches a staff handler unchecked.
    """
    resource = request.match_info.route.resource
    if resource is None or not guarded(resource.canonical):
        return await handler(request)
    auth = request.app[ADMIN].auth
    try:
        staff = await auth.authenticate(request)
    except Unauthorized:
        if _is_under(resource.canonical, CONSOLE_PREFIX) and request.method == "GET":
            raise web.HTTPSeeOther(f"{SIGN_IN_PAGE}?next={quote(request.path_qs)}") from None
        request[ERROR_HEADERS] = {"WWW-Authenticate": 'Bearer realm="parley-admin"'}
        raise
    await auth.check_csrf(request, staff)
    request[STAFF] = staff
    return await handler(request)


async def while_allowed(
    request: web.Request, needed: Role, work: Coroutine[Any, Any, T]
) -> T | None:
    """Run ``work``, the body of a long-lived staff request, for as long as the request's
    credentials still allow ``needed`` (`StaffAuth.still_allowed`, every ``RECHECK_SECONDS``);
    None when they stopped doing so and ``work`` was cancelled.

    The guard let the request in once; without this, a stream opened by an account that is
    then disabled, demoted or signed out would go on for as long as it lasts."""
    auth = request.app[ADMIN].auth
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=RECHECK_SECONDS)
            if done:
                return task.result()
            if not await auth.still_allowed(request, needed):
                staff = request.get(STAFF)
                log.info(
                    "admin.stream.ended path=%s staff=%s reason=no_longer_allowed",
                    request.path,
                    staff.id if staff is not None else "-",
                )
                return None
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def after_sign_in(next_path: str | None) -> str:
    """Where to send a browser after signing in: its ``next`` page if that is one of ours.

    Checked as given, with nothing removed first: browsers drop tabs and newlines from a
    ``Location`` (so ``/<tab>/evil.example`` becomes ``//evil.example``) and read a backslash
    as a slash, so a control character, whitespace or backslash anywhere means the start page.
    """
    if next_path is not None and _same_origin_path(next_path):
        return next_path
    return CONSOLE_PREFIX


def _same_origin_path(path: str) -> bool:
    if len(path) < 2 or path[0] != "/" or path[1] == "/":
        return False
    if any(ch.isspace() or ch == "\\" or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in path):
        return False
    try:
        parts = urlsplit(path)
    except ValueError:
        return False
    return not parts.scheme and not parts.netloc
