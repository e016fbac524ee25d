"""The staff console at /admin: server-rendered pages over the admin API's own operations.

Every page and form calls the same operation the JSON API calls (`gateway.admin.api`), so
a rule checked for one is checked for the other. The guard (`gateway.admin.guard`) has let
only signed-in staff through, and only with the session's CSRF token on a form. Each route
names the staff role it needs, checked here before its handler runs: a page or form an
agent may not use is a 403 page, whichever URL reached it.
"""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

from aiohttp import web

from gateway.admin.auth import current_staff
from gateway.admin.console import (
    agent,
    conversations,
    inbox,
    inbox_work,
    knowledge,
    notifications,
    privacy,
    reports,
    sign_in,
)
from gateway.admin.console.render import Route, refused, setup_templates

STATIC = Path(__file__).resolve().parents[2] / "static"
STATIC_FILES = {
    "admin.css": "text/css",
    "admin.js": "application/javascript",
    "notify.js": "application/javascript",
    "inbox.js": "application/javascript",
}


def _static(name: str, content_type: str) -> web.RouteDef:
    path = STATIC / name

    async def serve(request: web.Request) -> web.StreamResponse:
        # Read whole (a few kB) rather than streamed from an open file, which a browser that
        # goes away mid-answer would leave open. Revalidated on every use by its ETag, so a
        # new release shows at once.
        body = await asyncio.to_thread(path.read_bytes)
        etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
        headers = {
            "Cache-Control": "no-cache",
            "ETag": etag,
            "X-Content-Type-Options": "nosniff",
        }
        if etag in request.headers.get("If-None-Match", ""):
            return web.Response(status=304, headers=headers)
        return web.Response(body=body, headers=headers | {"Content-Type": content_type})

    return web.get(f"/admin/static/{name}", serve)


def _enforced(route: Route) -> web.RouteDef:
    """The route, refused (403 page) to staff whose role it does not allow."""
    handler, needed = route.handler, route.role
    if needed is None:
        return web.route(route.method, route.path, handler)

    async def checked(request: web.Request) -> web.StreamResponse:
        if not current_staff(request).may(needed):
            return await refused(request, needed)
        return await handler(request)

    checked.__name__ = handler.__name__
    return web.route(route.method, route.path, checked)


def pages() -> list[Route]:
    """Every console route with the role it needs."""
    return [
        *sign_in.routes(),
        *conversations.routes(),
        *inbox_work.routes(),
        *inbox.routes(),
        *agent.routes(),
        *knowledge.routes(),
        *reports.routes(),
        *notifications.routes(),
        *privacy.routes(),
    ]


def console_routes() -> list[web.RouteDef]:
    return [
        *(_enforced(r) for r in pages()),
        *(_static(name, kind) for name, kind in STATIC_FILES.items()),
    ]


def setup_console(app: web.Application) -> None:
    setup_templates(app)
    app.add_routes(console_routes())
