"""Reading the client's address from what trusted proxies write, and nothing else."""

from __future__ import annotations

from ipaddress import ip_network

import pytest
from aiohttp.test_utils import make_mocked_request
from multidict import CIMultiDict

from gateway.client_address import ProxyTrust, parse_address, subscriber

PROXIES = (ip_network("10.0.0.0/8"), ip_network("fd00::/8"))


def _resolve(peer: str, *headers: tuple[str, str], header: str = "x-forwarded-for") -> str:
    request = make_mocked_request("GET", "/", headers=CIMultiDict(headers)).clone(remote=peer)
    trust = ProxyTrust(PROXIES, "forwarded" if header == "forwarded" else "x-forwarded-for")
    return trust.resolve(request)


def test_a_peer_that_is_not_a_trusted_proxy_is_the_client_whatever_it_says() -> None:
    assert _resolve("203.0.113.5", ("X-Forwarded-For", "192.0.2.1")) == "203.0.113.5"
    assert _resolve("203.0.113.5", ("Forwarded", "for=192.0.2.1"), header="forwarded") == (
        "203.0.113.5"
    )


@pytest.mark.parametrize(
    ("values", "client"),
    [
        (["192.0.2.1"], "192.0.2.1"),
        (["198.51.100.1, 192.0.2.1"], "192.0.2.1"),  # the client's own entry is left of it
        (["192.0.2.1, 10.0.0.7"], "192.0.2.1"),  # a second trusted proxy is passed over
        (["198.51.100.1", "192.0.2.1, 10.9.9.9"], "192.0.2.1"),  # headers in order
        (["[2001:db8::1]:443"], "2001:db8::1"),
        (["192.0.2.1:5555"], "192.0.2.1"),
        (["::ffff:192.0.2.1"], "192.0.2.1"),
        (["10.0.0.9, 10.0.0.8"], "10.0.0.9"),  # from inside: the farthest proxy
        (["192.0.2.1, not-an-address, 10.0.0.8"], "10.0.0.8"),  # nothing left of it counts
        ([], "10.0.0.2"),  # no header: the proxy itself
    ],
)
def test_x_forwarded_for_from_a_trusted_proxy(values: list[str], client: str) -> None:
    assert _resolve("10.0.0.2", *(("X-Forwarded-For", v) for v in values)) == client


@pytest.mark.parametrize(
    ("value", "client"),
    [
        ("for=192.0.2.60;proto=http;by=203.0.113.43", "192.0.2.60"),
        ('for="[2001:db8:cafe::17]:4711"', "2001:db8:cafe::17"),
        ("for=198.51.100.1, for=192.0.2.60, for=10.1.1.1", "192.0.2.60"),
        ("for=192.0.2.1, for=unknown", "10.0.0.2"),  # an unknown hop hides what is left of it
        ("for=192.0.2.1, proto=https", "10.0.0.2"),  # so does a hop without "for"
    ],
)
def test_forwarded_from_a_trusted_proxy(value: str, client: str) -> None:
    assert _resolve("10.0.0.2", ("Forwarded", value), header="forwarded") == client


def test_only_the_configured_header_is_read() -> None:
    both = (("X-Forwarded-For", "192.0.2.1"), ("Forwarded", "for=198.51.100.1"))
    assert _resolve("10.0.0.2", *both) == "192.0.2.1"
    assert _resolve("10.0.0.2", *both, header="forwarded") == "198.51.100.1"


def test_ipv6_proxies_and_addresses_that_are_none() -> None:
    assert _resolve("fd00::1", ("X-Forwarded-For", "2001:db8::5")) == "2001:db8::5"
    assert parse_address("_hidden") is None
    assert parse_address("") is None
    assert parse_address('"[2001:db8::1]"') is not None


def test_an_ipv6_client_is_told_apart_by_its_64() -> None:
    assert subscriber("2001:db8:1:2:aaaa::1") == subscriber("2001:db8:1:2:bbbb::2")
    assert subscriber("2001:db8:1:2::1") == "2001:db8:1:2::/64"
    assert subscriber("2001:db8:1:3::1") != subscriber("2001:db8:1:2::1")
    assert subscriber("192.0.2.1") == "192.0.2.1"
    assert subscriber("unknown") == "unknown"
