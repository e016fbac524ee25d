"""Which addresses the crawler may connect to."""

from __future__ import annotations

from ipaddress import ip_address, ip_network

import pytest

from core.knowledge.outbound import OutboundPolicy, is_private


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",  # loopback
        "10.1.2.3",  # private
        "172.16.0.1",
        "192.168.1.1",
        "169.254.169.254",  # link-local: cloud metadata
        "100.64.0.1",  # carrier-grade NAT
        "0.0.0.0",  # unspecified
        "224.0.0.1",  # multicast
        "240.0.0.1",  # reserved
        "::1",
        "::",
        "fe80::1",  # link-local
        "fc00::1",  # unique-local
        "fd12:3456::1",
        "ff02::1",  # multicast
        "::ffff:127.0.0.1",  # IPv4-mapped
        "::ffff:10.0.0.1",
        "::ffff:169.254.169.254",
        "2002:7f00:1::",  # 6to4 around 127.0.0.1
    ],
)
def test_non_public_addresses_are_private(address: str) -> None:
    assert is_private(ip_address(address))
    assert not OutboundPolicy().permits(address)


@pytest.mark.parametrize("address", ["93.184.216.34", "8.8.8.8", "2606:4700::1111"])
def test_public_addresses_are_permitted(address: str) -> None:
    assert not is_private(ip_address(address))
    assert OutboundPolicy().permits(address)


def test_the_allow_list_opens_only_its_own_networks() -> None:
    policy = OutboundPolicy([ip_network("10.20.0.0/16"), ip_network("fd00::/8")])
    assert policy.permits("10.20.3.4")
    assert policy.permits("::ffff:10.20.3.4")
    assert policy.permits("fd00::5")
    assert not policy.permits("10.21.0.1")
    assert not policy.permits("127.0.0.1")
    assert policy.permits("93.184.216.34")


def test_what_is_not_an_address_is_not_permitted() -> None:
    assert not OutboundPolicy().permits("localhost")
