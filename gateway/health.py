"""Liveness, readiness and metrics endpoints."""

from __future__ import annotations

import asyncio

from aiohttp import web

from core.errors import Unavailable
from core.llm.probe import ModelStatus
from gateway.keys import CACHE, DATABASE, METRICS, MODEL_WATCH, SETTINGS
from gateway.metrics import check_access
from gateway.middlewares import error_response

routes = web.RouteTableDef()

_CHECK_TIMEOUT = 2.0


@routes.get("/healthz")
async def healthz(request: web.Request) -> web.Response:
    """The process is up and serving; says nothing about its dependencies."""
    return web.json_response({"status": "ok"})


@routes.get("/readyz")
async def readyz(request: web.Request) -> web.Response:
    """Ready when the database answers: 503 naming what failed when it does not.

    Redis is a cache, never a dependency of an answer: without it every request is still
    answered (caches bypassed, rate limits in-process), so a Redis that does not answer
    makes the gateway ``degraded``, still 200, lest a load balancer take every gateway out.

    The model (when one is configured) is ``degraded`` too while its server does not
    answer or does not have it: every gateway shares it, so taking this one out of traffic
    mends nothing, and without it webhooks are still taken into the inbox (answered once
    the model is back), curated, cached and small-talk answers still go out and staff
    still work. Its check is at most 30 s old (1 s while it fails); one that takes longer
    than the others' time leaves the last result (or "unknown" before the first).
    """
    cache = request.app[CACHE]
    cache_check = f"cache ({cache.kind})"
    checks = {
        "database": request.app[DATABASE].ping(_CHECK_TIMEOUT),
        cache_check: asyncio.wait_for(cache.ping(), _CHECK_TIMEOUT),
    }
    watch = request.app.get(MODEL_WATCH)

    async def model_status() -> ModelStatus | None:
        return await watch.status(within=_CHECK_TIMEOUT) if watch is not None else None

    results, model = await asyncio.gather(
        asyncio.gather(*checks.values(), return_exceptions=True), model_status()
    )
    report: dict[str, str] = {}
    failed = []
    degraded = False
    for name, result in zip(checks, results, strict=True):
        if not isinstance(result, BaseException):
            report[name] = "ok"
            continue
        reason = result.message if isinstance(result, Unavailable) else "no answer in time"
        if name == cache_check:
            report[name] = f"degraded: {reason}; answering without it"
            degraded = True
        else:
            report[name] = reason
            failed.append(f"{name}: {reason}")
    if watch is not None:
        name = f"model ({watch.model})"
        if model is None:
            report[name] = "unknown: being checked"
        elif model.ok:
            report[name] = "ok"
        else:
            report[name] = f"degraded: {model.detail}; answers it writes fail meanwhile"
            degraded = True
    if failed:
        response = error_response(503, "not_ready", "not ready: " + "; ".join(failed))
        response.headers["Cache-Control"] = "no-store"
        return response
    status = "degraded" if degraded else "ready"
    return web.json_response(
        {"status": status, "checks": report}, headers={"Cache-Control": "no-store"}
    )


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    check_access(request, request.app[SETTINGS].metrics_token)
    return request.app[METRICS].render()
