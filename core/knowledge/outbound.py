"""The only way out for the crawler and media downloads: HTTP sessions that refuse to connect
to private addresses."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Sequence
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_address, ip_network
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult

IPAddress = IPv4Address | IPv6Address
IPNetwork = IPv4Network | IPv6Network

# Ranges `ipaddress` has no property for (is_private misses CGNAT on older Pythons).
_CGNAT = ip_network("100.64.0.0/10")
_UNIQUE_LOCAL = ip_network("fc00::/7")

REFUSED = "refused: private address"


class PrivateAddressRefused(OSError):
    """A crawl would have connected to an address that is not on the public internet.

    An `OSError` because aiohttp wraps those from resolvers and sockets into its own
    connection errors, which is where the crawler tells the refusal apart. The message
    names neither address nor port: it reaches the staff console."""

    def __init__(self) -> None:
        super().__init__(REFUSED)


def is_private(address: IPAddress) -> bool:
    """Whether an address is one the crawler must not reach: anything not public."""
    if isinstance(address, IPv6Address):
        # an IPv4 address written as IPv6 reaches the IPv4 host it names
        embedded = address.ipv4_mapped or address.sixtofour
        if embedded is not None:
            return is_private(embedded)
        if address in _UNIQUE_LOCAL:
            return True
    return (
        address.is_private
        or address.is_loopback
        or address.is_link_local
        or address.is_multicast
        or address.is_unspecified
        or address.is_reserved
        or address in _CGNAT
        or not address.is_global
    )


class OutboundPolicy:
    """Which addresses a crawl may connect to: public ones, and those on the allow-list."""

    def __init__(self, allow: Sequence[IPNetwork] = ()) -> None:
        self._allow = tuple(allow)

    def permits(self, host: str) -> bool:
        try:
            address = ip_address(host.split("%", 1)[0])  # an IPv6 zone does not matter here
        except ValueError:
            return False  # not an address at all: nothing to vouch for
        mapped = address.ipv4_mapped if isinstance(address, IPv6Address) else None
        if mapped is not None and self._allowed(mapped):
            return True
        return self._allowed(address) or not is_private(address)

    def check(self, host: str) -> None:
        if not self.permits(host):
            raise PrivateAddressRefused()

    def _allowed(self, address: IPAddress) -> bool:
        return any(address.version == net.version and address in net for net in self._allow)


class _GuardedResolver(AbstractResolver):
    """Resolves as usual, then keeps only the addresses the policy permits."""

    def __init__(self, policy: OutboundPolicy, inner: AbstractResolver) -> None:
        self._policy = policy
        self._inner = inner

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        found = await self._inner.resolve(host, port, family)
        permitted = [entry for entry in found if self._policy.permits(entry["host"])]
        if not permitted:
            raise PrivateAddressRefused()
        return permitted

    async def close(self) -> None:
        await self._inner.close()


class _GuardedConnector(aiohttp.TCPConnector):
    """A connector whose every socket is checked against the policy just before it connects.

    aiohttp hands literal IP hosts past the resolver, so the resolver alone would not see
    ``http://127.0.0.1/``; the socket factory sees the very address connected to, for
    the first request, each redirect, robots.txt and sitemaps alike."""

    def __init__(
        self, policy: OutboundPolicy, resolver: AbstractResolver, tls: ssl.SSLContext | bool
    ) -> None:
        self._policy = policy
        super().__init__(
            resolver=_GuardedResolver(policy, resolver), socket_factory=self._socket, ssl=tls
        )

    def _socket(self, addr_info: Any) -> socket.socket:
        family, type_, proto, _, sockaddr = addr_info
        self._policy.check(str(sockaddr[0]))
        return socket.socket(family=family, type=type_, proto=proto)


def crawler_session(
    allow: Sequence[IPNetwork] = (),
    *,
    resolver: AbstractResolver | None = None,
    tls: ssl.SSLContext | None = None,
) -> aiohttp.ClientSession:
    """A session for crawling (and for media downloads, `core.media`): public addresses
    only, plus ``allow`` (an intranet, say).

    ``resolver`` answers the DNS questions (the system's resolver by default); whatever it
    answers is checked. ``tls`` replaces the default certificate checks (a test's own
    authority). Proxies from the environment are ignored: the address checked must be the
    one reached."""
    connector = _GuardedConnector(
        OutboundPolicy(allow), resolver or aiohttp.DefaultResolver(), True if tls is None else tls
    )
    return aiohttp.ClientSession(connector=connector, trust_env=False)


def is_guarded(session: aiohttp.ClientSession) -> bool:
    """Whether ``session`` came from `crawler_session`."""
    return isinstance(session.connector, _GuardedConnector)
