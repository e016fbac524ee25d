"""Request ids, metrics and the one place where errors become HTTP responses."""

from __future__ import annotations

import logging
import re
import time
import uuid
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from channels.web import ERROR_HEADERS
from core import logcontext
from core.errors import (
    Conflict,
    Forbidden,
    InvalidInput,
    NotFound,
    ParleyError,
    RateLimited,
    Unauthorized,
    Unavailable,
)
from gateway.keys import METRICS

log = logging.getLogger(__name__)

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")

# Most specific first: the first class the error is an instance of decides the status.
_STATUS: tuple[tuple[type[ParleyError], int], ...] = (
    (Unauthorized, 401),
    (Forbidden, 403),
    (NotFound, 404),
    (Conflict, 409),
    (InvalidInput, 400),
    (RateLimited, 429),
    (Unavailable, 503),
)

_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    415: "unsupported_media_type",
    429: "rate_limited",
}


def error_response(
    status: int, code: str, message: str, headers: dict[str, str] | None = None
) -> web.Response:
    """The JSON body every error has: ``{"error": {"code", "message"}}``."""
    return web.json_response(
        {"error": {"code": code, "message": message}}, status=status, headers=headers
    )


def status_for(error: ParleyError) -> int:
    for kind, status in _STATUS:
        if isinstance(error, kind):
            return status
    return 500


@web.middleware
async def request_context(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Bind a request id (the caller's, if well-formed) to logs and echo it back."""
    given = request.headers.get("X-Request-Id", "")
    rid = given if _REQUEST_ID.match(given) else uuid.uuid4().hex
    token = logcontext.request_id.set(rid)
    try:
        response = await handler(request)
        if not response.prepared:
            response.headers["X-Request-Id"] = rid
        return response
    finally:
        logcontext.request_id.reset(token)


@web.middleware
async def metrics(request: web.Request, handler: Handler) -> web.StreamResponse:
    started = time.perf_counter()
    status = 499  # the client went away before an answer
    try:
        response = await handler(request)
        status = response.status
        return response
    finally:
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else "unmatched"
        request.app[METRICS].observe(request.method, route, status, time.perf_counter() - started)


@web.middleware
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Turn every failure into the JSON error body, logging each one exactly once."""
    try:
        return await handler(request)
    except ParleyError as exc:
        status = status_for(exc)
        level = logging.ERROR if status >= 500 else logging.INFO
        log.log(level, "request.failed status=%d code=%s path=%s", status, exc.code, request.path)
        headers = dict(request.get(ERROR_HEADERS, {}))
        if isinstance(exc, RateLimited):
            headers["Retry-After"] = str(max(1, round(exc.retry_after)))
        return error_response(status, exc.code, exc.message, headers)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        passed: dict[str, Any] = {
            k: v for k, v in exc.headers.items() if k.lower() in ("allow", "retry-after")
        } | dict(request.get(ERROR_HEADERS, {}))
        code = _HTTP_CODES.get(exc.status, "http_error")
        return error_response(exc.status, code, exc.reason, passed)
    except Exception:
        log.exception("request.crashed path=%s", request.path)
        return error_response(500, "internal", "internal error")
