"""The staff console at /admin: server-rendered pages over the admin API's own operations.

Every page and form calls the same operation the JSON API calls (`gateway.admin.api`), so
a rule checked for one is checked for the other. The guard (`gateway.admin.guard`) has let
only signed-in staff through, and only with the session's CSRF token on a form.
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

from gateway.admin.console import agent, conversations, inbox, knowledge, sign_in
from gateway.admin.console.render import setup_templates

STATIC = Path(__file__).resolve().parents[2] / "static"
STATIC_FILES = {"admin.css": "text/css", "admin.js": "application/javascript"}


def _static(name: str, content_type: str) -> web.RouteDef:
    path = STATIC / name

    async def serve(request: web.Request) -> web.StreamResponse:
        # Revalidated on every use (ETag / Last-Modified), so a new release shows at once.
        return web.FileResponse(
            path,
            headers={
                "Cache-Control": "no-cache",
                "Content-Type": content_type,
                "X-Content-Type-Options": "nosniff",
            },
        )

    return web.get(f"/admin/static/{name}", serve)


def console_routes() -> list[web.RouteDef]:
    return [
        *sign_in.routes(),
        *conversations.routes(),
        *inbox.routes(),
        *agent.routes(),
        *knowledge.routes(),
        *(_static(name, kind) for name, kind in STATIC_FILES.items()),
    ]


def setup_console(app: web.Application) -> None:
    setup_templates(app)
    app.add_routes(console_routes())
