"""Adds the staff side to the gateway: its services, its guard, the admin API and console."""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web

from gateway.admin.api import admin_routes
from gateway.admin.console import setup_console
from gateway.admin.guard import admin_guard
from gateway.admin.openapi import openapi_routes
from gateway.admin.services import AdminServices
from gateway.keys import ADMIN, CACHE, DATABASE, EMBEDDER, HANDOFF, RUNTIME, SETTINGS


async def _admin_services(app: web.Application) -> AsyncIterator[None]:
    services = AdminServices.build(
        app[SETTINGS],
        app[DATABASE].pool,
        app[CACHE],
        app[EMBEDDER],
        app[HANDOFF],
        app[RUNTIME].agents,
        outbox_queued=app[RUNTIME].outbox_queued.set,
    )
    app[ADMIN] = services
    yield
    await services.close()


def setup_admin(app: web.Application) -> None:
    """Call after the database, cache, embedder and channels (which build the
    conversations' ``Handoff``) are in ``app.cleanup_ctx``.

    The guard goes last among the middlewares, inside the error middleware, so that its
    refusals get the usual JSON error body.
    """
    app.cleanup_ctx.append(_admin_services)
    app.middlewares.append(admin_guard)
    app.add_routes(admin_routes())
    app.add_routes(openapi_routes())
    setup_console(app)
