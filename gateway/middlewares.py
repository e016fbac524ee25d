"""Request ids, metrics, body deadlines and the one place where errors become HTTP responses."""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from typing import Any

from aiohttp import web
from aiohttp.streams import StreamReader
from aiohttp.typedefs import Handler, Middleware

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
from gateway.keys import METRICS, RUNTIME

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


class BodyTimedOut(TimeoutError):
    """A request body that had not all arrived in time.

    A `TimeoutError`, because aiohttp, which reads what is left of an unread body (up to its
    lingering time) before it closes the connection, stops at once on one of those.
    """


def body_deadline(seconds: float) -> Middleware:
    """Reading a request body fails with `BodyTimedOut` (a 408) once ``seconds`` have passed
    since its headers came, and it has still not all arrived.

    aiohttp waits for a body as long as the client keeps the connection open, so a client
    sending a byte now and then would hold a connection, and a handler, for ever. The
    deadline lies on the body itself, so every way a handler reads it (``read``, ``json``,
    ``post``, a multipart reader) is bounded, the Twilio form read before its signature is
    checked included.
    """

    @web.middleware
    async def deadline(request: web.Request, handler: Handler) -> web.StreamResponse:
        body = request.content
        if body.is_eof():  # no body, or all of it here already
            return await handler(request)
        timer = asyncio.get_running_loop().call_later(seconds, _expire, body, seconds)
        try:
            return await handler(request)
        finally:
            timer.cancel()

    return deadline


def _expire(body: StreamReader, seconds: float) -> None:
    if not body.is_eof():
        body.set_exception(BodyTimedOut(f"the request body did not arrive within {seconds:g} s"))


@web.middleware
async def webhooks_first(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Counts the webhooks in flight, which the workers of this process give way to
    (`gateway.intake`)."""
    if not request.path.startswith("/webhooks/"):
        return await handler(request)
    with request.app[RUNTIME].intake.arrived():
        return await handler(request)


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
        if "\x00" in request.path:
            # No agent, id or page has one, and PostgreSQL cannot even be asked about it.
            raise NotFound("nothing has a NUL character (%00) in its address")
        return await handler(request)
    except ParleyError as exc:
        status = status_for(exc)
        level = logging.ERROR if status >= 500 else logging.INFO
        log.log(level, "request.failed status=%d code=%s path=%s", status, exc.code, request.path)
        headers = dict(request.get(ERROR_HEADERS, {}))
        if isinstance(exc, RateLimited):
            headers["Retry-After"] = str(max(1, round(exc.retry_after)))
        return error_response(status, exc.code, exc.message, headers)
    except BodyTimedOut as exc:
        log.info("request.failed status=408 code=request_timeout path=%s", request.path)
        response = error_response(408, "request_timeout", str(exc))
        response.force_close()  # the rest of the body is not waited for
        return response
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
