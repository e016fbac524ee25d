"""The address a request comes from: the connection's, or what a trusted proxy says it was.

Rate limits and sign-in back-off are kept per client address, so it must be the visitor's
and not the proxy's (behind a proxy every visitor would share one budget), and it must not
be whatever a client writes into a header (or each request could claim a fresh address).

Only when the connection comes from one of ``PARLEY_TRUSTED_PROXIES`` is the forwarding
header read (``X-Forwarded-For``, or RFC 7239 ``Forwarded`` with
``PARLEY_FORWARDED_HEADER=forwarded``; never both, since a proxy that writes one passes the
other through as the client sent it). Its hops are read from the right, each added by the
proxy that received the request from the hop before: the first that is not itself a trusted
proxy is the client. What stands left of it was written by the client and is ignored, and
so is everything left of a hop that is not an address.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Network, IPv6Network
from typing import Literal

from aiohttp import web

from core.clients import IPAddress, parse_address, subscriber
from core.settings import Settings

__all__ = ["UNKNOWN", "ProxyTrust", "client_address", "parse_address", "subscriber"]

Network = IPv4Network | IPv6Network

UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class ProxyTrust:
    """Which peers may say who the client is, and in which header."""

    proxies: Sequence[Network] = ()
    header: Literal["x-forwarded-for", "forwarded"] = "x-forwarded-for"

    @classmethod
    def of(cls, settings: Settings) -> ProxyTrust:
        return cls(tuple(settings.trusted_proxies), settings.forwarded_header)

    def resolve(self, request: web.BaseRequest) -> str:
        """The client's address of ``request``."""
        peer = parse_address(request.remote or "")
        if peer is None:
            return request.remote or UNKNOWN
        if not _within(peer, self.proxies):
            return str(peer)
        nearest = peer  # the last hop known to be a trusted proxy
        for hop in _hops(request, self.header):
            address = parse_address(hop)
            if address is None:
                break
            if not _within(address, self.proxies):
                return str(address)
            nearest = address
        # Every hop a trusted proxy (a request from inside), or one that is not an address:
        # the nearest proxy is the best that can be believed.
        return str(nearest)


PROXY_TRUST = web.AppKey("proxy_trust", ProxyTrust)
_CLIENT_ADDRESS = web.RequestKey("client_address", str)
_NO_PROXIES = ProxyTrust()


def client_address(request: web.Request) -> str:
    """The client's address, worked out once per request (trusting no proxy unless the
    application was given a `ProxyTrust` under ``PROXY_TRUST``)."""
    known = request.get(_CLIENT_ADDRESS)
    if known is None:
        known = request.app.get(PROXY_TRUST, _NO_PROXIES).resolve(request)
        request[_CLIENT_ADDRESS] = known
    return known


def _within(address: IPAddress, networks: Sequence[Network]) -> bool:
    return any(address.version == net.version and address in net for net in networks)


def _hops(request: web.BaseRequest, header: str) -> Iterator[str]:
    """The header's hops, nearest (right-most) first; a hop without a ``for`` is ""."""
    if header == "forwarded":
        for element in reversed(request.forwarded):
            yield element.get("for", "")
        return
    hops = [
        hop for value in request.headers.getall("X-Forwarded-For", ()) for hop in value.split(",")
    ]
    yield from reversed(hops)
