"""Liveness, readiness and metrics endpoints."""

from __future__ import annotations

import asyncio

from aiohttp import web

from core.errors import Unavailable
from gateway.keys import CACHE, DATABASE, METRICS
from gateway.middlewares import error_response

routes = web.RouteTableDef()

_CHECK_TIMEOUT = 2.0


@routes.get("/healthz")
async def healthz(request: web.Request) -> web.Response:
    """The process is up and serving; says nothing about its dependencies."""
    return web.json_response({"status": "ok"})


@routes.get("/readyz")
async def readyz(request: web.Request) -> web.Response:
    """Ready when the database and the cache both answer; 503 naming each that does not."""
    cache = request.app[CACHE]
    checks = {
        "database": request.app[DATABASE].ping(_CHECK_TIMEOUT),
        f"cache ({cache.kind})": asyncio.wait_for(cache.ping(), _CHECK_TIMEOUT),
    }
    results = await asyncio.gather(*checks.values(), return_exceptions=True)
    report: dict[str, str] = {}
    failed = []
    for name, result in zip(checks, results, strict=True):
        if isinstance(result, BaseException):
            reason = result.message if isinstance(result, Unavailable) else "no answer in time"
            report[name] = reason
            failed.append(f"{name}: {reason}")
        else:
            report[name] = "ok"
    if failed:
        response = error_response(503, "not_ready", "not ready: " + "; ".join(failed))
        response.headers["Cache-Control"] = "no-store"
        return response
    return web.json_response({"status": "ready", "checks": report})


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    return request.app[METRICS].render()
