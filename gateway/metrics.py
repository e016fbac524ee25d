"""Prometheus metrics of the gateway, in a registry of the app's own (tests build many apps)."""

from __future__ import annotations

import hashlib
import hmac
from ipaddress import ip_address

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.process_collector import ProcessCollector
from pydantic import SecretStr

from core.errors import Forbidden, Unauthorized

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class HttpMetrics:
    """Request counts and latency histograms, labelled by route template (not raw path)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        self.requests = Counter(
            "parley_http_requests",
            "HTTP requests handled, by method, route and status.",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "parley_http_request_duration_seconds",
            "Time from request to response headers, by method and route.",
            ["method", "route"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        self.requests.labels(method, route, str(status)).inc()
        self.latency.labels(method, route).observe(seconds)

    def render(self) -> web.Response:
        return web.Response(
            body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )


# Headers a reverse proxy adds: a request carrying one came from elsewhere, even when the
# connection is from this machine.
_FORWARDING_HEADERS = ("Forwarded", "X-Forwarded-For", "X-Real-IP")


def check_access(request: web.BaseRequest, token: SecretStr | None) -> None:
    """Whether ``request`` may read the metrics (route names, traffic, process figures).

    With ``token`` (PARLEY_METRICS_TOKEN) it must carry ``Authorization: Bearer <token>``,
    compared in constant time; without one only a client on this machine may, and not through
    a proxy: a proxy on the same host would otherwise make every visitor local."""
    if token is not None:
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        expected = hashlib.sha256(token.get_secret_value().encode()).digest()
        offered = hashlib.sha256(given.strip().encode()).digest()
        if scheme.lower() != "bearer" or not hmac.compare_digest(offered, expected):
            raise Unauthorized("the metrics need Authorization: Bearer <PARLEY_METRICS_TOKEN>")
        return
    if not _loopback(request.remote) or any(h in request.headers for h in _FORWARDING_HEADERS):
        raise Forbidden(
            "the metrics are served to this machine only; set PARLEY_METRICS_TOKEN to scrape "
            "them from elsewhere"
        )


def _loopback(remote: str | None) -> bool:
    try:
        address = ip_address(remote or "")
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1 on a dual-stack socket
    return bool(address.is_loopback or (mapped is not None and mapped.is_loopback))
