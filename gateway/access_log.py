"""One event-style line per request, carrying the request id the middleware bound."""

from __future__ import annotations

import logging

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger


class AccessLogger(AbstractAccessLogger):
    """Logs method, route path, status, size and time; never query strings or bodies."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        if not self.logger.isEnabledFor(logging.INFO):
            return
        self.logger.info(
            "http.request method=%s path=%s status=%d bytes=%d seconds=%.4f request_id=%s",
            request.method,
            request.path,
            response.status,
            response.body_length,
            time,
            response.headers.get("X-Request-Id", "-"),
        )
