"""Who may read /metrics: with PARLEY_METRICS_TOKEN, its bearer; without, this machine only."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from gateway.app import create_app
from tests.conftest import MakeSettings

METRICS_TOKEN = "metrics-token-for-tests-0123456789abcdef"


def _own_address() -> str | None:
    """An address of this machine that is not loopback, if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # no packet is sent: the route picks the address
        except OSError:
            return None
        address = str(probe.getsockname()[0])
    return None if address.startswith("127.") or address == "0.0.0.0" else address


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def _start(make_settings: MakeSettings, host: str, **settings: object) -> TestServer:
    server = TestServer(create_app(make_settings(**settings)), host=host)
    await server.start_server()
    return server


async def test_with_a_token_only_its_bearer_reads_the_metrics(
    make_settings: MakeSettings, session: aiohttp.ClientSession
) -> None:
    server = await _start(make_settings, "127.0.0.1", metrics_token=METRICS_TOKEN)
    try:
        url = server.make_url("/metrics")
        for headers in (
            {},
            {"Authorization": "Bearer wrong-token-of-the-same-length-0123456789"},
            {"Authorization": f"Bearer {METRICS_TOKEN}x"},
            {"Authorization": f"Basic {METRICS_TOKEN}"},
            {"Authorization": METRICS_TOKEN},
        ):
            async with session.get(url, headers=headers) as refused:
                assert refused.status == 401, headers  # loopback is no excuse with a token
                body = await refused.json()
                assert body["error"]["code"] == "unauthorized"
                assert "PARLEY_METRICS_TOKEN" in body["error"]["message"]
        async with session.get(url, headers={"Authorization": f"Bearer {METRICS_TOKEN}"}) as ok:
            assert ok.status == 200
            assert "parley_http_requests_total" in await ok.text()
        async with session.get(url, headers={"Authorization": f"bearer  {METRICS_TOKEN} "}) as ok:
            assert ok.status == 200
    finally:
        await server.close()


async def test_without_a_token_only_this_machine_reads_them_and_not_through_a_proxy(
    make_settings: MakeSettings, session: aiohttp.ClientSession
) -> None:
    server = await _start(make_settings, "127.0.0.1")
    try:
        url = server.make_url("/metrics")
        async with session.get(url) as local:
            assert local.status == 200
        for header in ("X-Forwarded-For", "Forwarded", "X-Real-IP"):
            value = "for=203.0.113.9" if header == "Forwarded" else "203.0.113.9"
            async with session.get(url, headers={header: value}) as proxied:
                assert proxied.status == 403, header
                message = (await proxied.json())["error"]["message"]
                assert "set PARLEY_METRICS_TOKEN" in message
    finally:
        await server.close()


async def test_without_a_token_another_machine_is_refused(
    make_settings: MakeSettings, session: aiohttp.ClientSession
) -> None:
    address = _own_address()
    if address is None:
        pytest.skip("this machine has no address but loopback")
    server = await _start(make_settings, address)
    try:
        async with session.get(server.make_url("/metrics")) as remote:
            assert remote.status == 403
        async with session.get(server.make_url("/healthz")) as health:
            assert health.status == 200  # the rest of the gateway is served as before
    finally:
        await server.close()
    server = await _start(make_settings, address, metrics_token=METRICS_TOKEN)
    try:
        headers = {"Authorization": f"Bearer {METRICS_TOKEN}"}
        async with session.get(server.make_url("/metrics"), headers=headers) as scraped:
            assert scraped.status == 200
    finally:
        await server.close()
