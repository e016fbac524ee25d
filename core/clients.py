"""Client addresses as one client is told apart by: an IPv4 address, or an IPv6 /64."""

from __future__ import annotations

from ipaddress import IPv4Address, IPv6Address, IPv6Network, ip_address

IPAddress = IPv4Address | IPv6Address

# The IPv6 prefix one subscriber is given (RFC 6177): any address in it is theirs to use.
SUBSCRIBER_PREFIX = 64


def subscriber(address: str) -> str:
    """What one client can be told apart by: an IPv4 address, or the /64 an IPv6 address is
    in (a client holding a /64 could otherwise take a fresh address for every request)."""
    parsed = parse_address(address)
    if isinstance(parsed, IPv6Address):
        return str(IPv6Network((parsed, SUBSCRIBER_PREFIX), strict=False))
    return address


def parse_address(text: str) -> IPAddress | None:
    """An IP address as proxies write it: bare, quoted, ``[v6]:port`` or ``v4:port``."""
    text = text.strip().strip('"')
    if text.startswith("["):
        end = text.find("]")
        text = text[1:end] if end > 0 else ""
    elif text.count(":") == 1:
        text = text.partition(":")[0]
    try:
        address = ip_address(text)
    except ValueError:
        return None
    if isinstance(address, IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address
