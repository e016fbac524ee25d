"""Clients as the gateway sees them: their address behind a proxy, and slow ones cut off."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from core.errors import Conflict
from core.retrieval.embedders import UseEmbedder
from core.store import Agent, Agents
from core.store.vector_index import EmbedderIdentity
from gateway.app import create_app
from gateway.keys import DATABASE
from tests.conftest import MakeSettings

# The test client connects from 127.0.0.1: as a trusted proxy, it says who each client is.
PROXY = "127.0.0.1/32"
VISITOR = "203.0.113.5"
OTHER = "198.51.100.7"


@dataclass
class Gateway:
    server: TestServer
    agent: Agent

    @property
    def url(self) -> str:
        return str(self.server.make_url("")).rstrip("/")

    async def clear(self, headers: dict[str, str]) -> int:
        """The widget's "new conversation", a cheap request under the per-address limit."""
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                f"{self.url}/api/v1/agents/shop/conversations/clear",
                json={"session_id": f"session-{time.monotonic_ns()}"},
                headers={"X-Parley-Key": self.agent.widget_key, **headers},
            ) as response,
        ):
            return response.status


StartGateway = Callable[..., Awaitable[Gateway]]


@pytest.fixture
async def start_gateway(
    make_settings: MakeSettings, use_embedder: UseEmbedder
) -> AsyncIterator[StartGateway]:
    """The gateway built by create_app with the given settings, and agent ``shop``, whose
    limit per address is two requests (and whose limit per session never applies)."""
    servers: list[TestServer] = []

    async def start(**overrides: Any) -> Gateway:
        settings = make_settings(**overrides)
        server = TestServer(create_app(settings))
        await server.start_server()
        servers.append(server)
        agents = Agents(server.app[DATABASE].pool)
        with contextlib.suppress(Conflict):  # a second gateway of the test, on its database
            await agents.create("shop", embedder=EmbedderIdentity.of(use_embedder))
        limits = {"rate_limits": {"session": [100, 100], "ip": [0.001, 2]}}
        return Gateway(server, await agents.update("shop", settings=limits))

    yield start
    for server in servers:
        await server.close()


# -- the client's address ---------------------------------------------------------------


async def test_behind_a_trusted_proxy_each_visitor_has_a_budget_of_its_own(
    start_gateway: StartGateway,
) -> None:
    gw = await start_gateway(trusted_proxies=PROXY)
    visitor = {"X-Forwarded-For": VISITOR}
    assert [await gw.clear(visitor) for _ in range(3)] == [204, 204, 429]
    # Another visitor behind the same proxy is not held up by the first.
    assert await gw.clear({"X-Forwarded-For": OTHER}) == 204
    # What a client writes itself stands left of what the proxy adds, and is not believed;
    # nor is the other header, which this proxy does not write.
    assert await gw.clear({"X-Forwarded-For": f"192.0.2.1, {VISITOR}"}) == 429
    assert await gw.clear({"X-Forwarded-For": VISITOR, "Forwarded": "for=192.0.2.2"}) == 429
    # Proxies in a chain: hops that are trusted proxies themselves are passed over.
    chained = await start_gateway(trusted_proxies=f"{PROXY}, 10.0.0.0/8")
    hops = {"X-Forwarded-For": f"192.0.2.9, {VISITOR}, 10.1.2.3"}
    assert [await chained.clear(hops) for _ in range(3)] == [204, 204, 429]
    assert await chained.clear({"X-Forwarded-For": f"{OTHER}, 10.1.2.3"}) == 204


async def test_the_forwarded_header_when_the_proxy_writes_that_one(
    start_gateway: StartGateway,
) -> None:
    gw = await start_gateway(trusted_proxies=PROXY, forwarded_header="forwarded")
    visitor = {"Forwarded": 'for="[2001:db8::17]:4711";proto=https'}
    assert [await gw.clear(visitor) for _ in range(3)] == [204, 204, 429]
    assert await gw.clear({"Forwarded": f"for={OTHER};proto=https"}) == 204
    spoofed = {"Forwarded": 'for="[2001:db8::17]"', "X-Forwarded-For": "192.0.2.3"}
    assert await gw.clear(spoofed) == 429


async def test_without_trusted_proxies_forwarding_headers_change_nothing(
    start_gateway: StartGateway,
) -> None:
    gw = await start_gateway()
    assert await gw.clear({"X-Forwarded-For": VISITOR}) == 204
    assert await gw.clear({"X-Forwarded-For": OTHER}) == 204
    assert await gw.clear({"X-Forwarded-For": "192.0.2.1", "Forwarded": "for=192.0.2.2"}) == 429


# -- slow clients ----------------------------------------------------------------------


@dataclass
class Outcome:
    status_line: bytes  # b"" when the connection closed without an answer
    closed_after: float  # seconds from sending the headers until the connection closed


async def _trickle(port: int, sent: str, drip: bytes = b" ", every: float = 0.3) -> Outcome:
    """Send ``sent``, then ``drip`` every ``every`` seconds for as long as the connection
    stays open: what the gateway answered, and when it hung up."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    started = time.monotonic()
    writer.write(sent.encode())
    await writer.drain()

    async def dripping_in() -> None:
        with contextlib.suppress(OSError):
            while True:
                await asyncio.sleep(every)
                writer.write(drip)
                await writer.drain()

    dripping = asyncio.create_task(dripping_in())
    try:
        async with asyncio.timeout(20):
            answer = await reader.read()  # until the gateway closes the connection
        return Outcome(answer.partition(b"\r\n")[0], time.monotonic() - started)
    finally:
        dripping.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await dripping
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def test_chat_bodies_that_trickle_in_are_answered_408_and_their_connections_closed(
    start_gateway: StartGateway,
) -> None:
    gw = await start_gateway(body_read_seconds=1)
    assert gw.server.port is not None
    head = (
        "POST /api/v1/agents/shop/chat HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"X-Parley-Key: {gw.agent.widget_key}\r\nContent-Type: application/json\r\n"
        "Content-Length: 1000000\r\n\r\n{"
    )
    outcomes = await asyncio.gather(*(_trickle(gw.server.port, head) for _ in range(20)))
    for outcome in outcomes:
        assert outcome.status_line == b"HTTP/1.1 408 Request Timeout"
        assert 0.9 < outcome.closed_after < 4.0


async def test_the_twilio_form_is_read_within_the_same_bound(
    start_gateway: StartGateway,
) -> None:
    gw = await start_gateway(
        body_read_seconds=1,
        twilio_account_sid="AC" + "a" * 32,
        twilio_auth_token="env-auth-token-0123456789abcdef",
    )
    assert gw.server.port is not None
    head = (
        "POST /webhooks/twilio/shop HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "X-Twilio-Signature: c2lnbmF0dXJl\r\n"
        "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 1000000\r\n\r\n"
        "MessageSid=SM"
    )
    outcome = await _trickle(gw.server.port, head, b"1")
    assert outcome.status_line == b"HTTP/1.1 408 Request Timeout"
    assert outcome.closed_after < 4.0


async def test_a_body_that_arrives_in_pieces_within_the_bound_is_read(
    start_gateway: StartGateway,
) -> None:
    gw = await start_gateway(body_read_seconds=2)
    assert gw.server.port is not None
    body = json.dumps({"session_id": "session-pieces"}).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.server.port)
    writer.write(
        (
            "POST /api/v1/agents/shop/conversations/clear HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"X-Parley-Key: {gw.agent.widget_key}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode()
    )
    for piece in (body[:5], body[5:15], body[15:]):
        writer.write(piece)
        await writer.drain()
        await asyncio.sleep(0.4)
    async with asyncio.timeout(10):
        answer = await reader.read()
    writer.close()
    assert answer.startswith(b"HTTP/1.1 204")


async def test_headers_that_trickle_in_are_cut_off(start_gateway: StartGateway) -> None:
    gw = await start_gateway(keepalive_seconds=1)
    assert gw.server.port is not None
    head = "POST /api/v1/agents/shop/chat HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: a"
    outcome = await _trickle(gw.server.port, head, b"a")
    assert outcome.status_line == b""  # no request ever came, so nothing is answered
    assert 0.9 < outcome.closed_after < 4.0
