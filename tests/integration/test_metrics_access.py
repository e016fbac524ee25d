"""Who may read /metrics: with PARLEY_METRICS_TOKEN, its bearer; without, this machine only."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gateway.app import create_app
from tests.conftest import MakeSettings

METRICS_TOKEN = "metrics-token-for-tests-0123456789abcdef"


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


async def test_without_a_token_a_client_not_on_loopback_is_refused(
    make_settings: MakeSettings, tmp_path: Path
) -> None:
    # A Unix socket (a proxy in front of the gateway, as often deployed) has no loopback
    # address, like a client on another machine; it exists on every machine that runs this.
    for token, expected in ((None, 403), (METRICS_TOKEN, 200)):
        runner = web.AppRunner(create_app(make_settings(metrics_token=token)))
        await runner.setup()
        path = str(tmp_path / f"gateway-{expected}.sock")
        await web.UnixSite(runner, path).start()
        try:
            headers = {"Authorization": f"Bearer {METRICS_TOKEN}"} if token else {}
            async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path)) as session:
                async with session.get("http://gateway/metrics", headers=headers) as answer:
                    assert answer.status == expected
                async with session.get("http://gateway/healthz") as health:
                    assert health.status == 200  # the rest of the gateway is served as before
        finally:
            await runner.cleanup()
