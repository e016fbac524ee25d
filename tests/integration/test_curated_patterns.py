"""Curated-answer patterns on the gateway: checked by RE2 when saved, and a pattern staff
wrote can never hold the event loop (and /healthz with it) while a turn is matched."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from httpx_sse import aconnect_sse

from core.errors import InvalidInput
from core.store import Agents
from core.store.curated import CuratedAnswers
from core.store.vector_index import EmbedderIdentity
from gateway.app import create_app
from gateway.keys import DATABASE, EMBEDDER
from tests.conftest import MakeSettings

Client = TestClient[web.Request, web.Application]

TOKEN = "admin-token-for-pattern-tests-0123456789"
CURATED = "/api/v1/admin/agents/shop/curated"
# A pattern with nested quantifiers and a text it does not match: a backtracking engine
# takes about a second for 20 letters, twice as long for every letter more.
CATASTROPHIC = r"^(\w+\s?)+$"
EVIL = "a" * 26 + "!"


@pytest.fixture
async def client(make_settings: MakeSettings) -> AsyncIterator[Client]:
    client: Client = TestClient(
        TestServer(create_app(make_settings(admin_token=TOKEN))),
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    await client.start_server()
    app = client.server.app
    await Agents(app[DATABASE].pool).create("shop", embedder=EmbedderIdentity.of(app[EMBEDDER]))
    yield client
    await client.close()


async def _save(client: Client, body: dict[str, Any]) -> tuple[int, Any]:
    response = await client.post(CURATED, json={"answer": "Canned reply.", **body})
    return response.status, await response.json()


async def test_a_pattern_is_checked_by_the_engine_that_matches_it(client: Client) -> None:
    # look-behind: Python's re compiles it, RE2 cannot match it: refused, saying why
    status, body = await _save(client, {"pattern": r"(?<!not )happy"})
    assert status == 400, body
    message = body["error"]["message"]
    assert message.startswith("pattern: ")
    assert "invalid perl operator: (?<!" in message
    assert "RE2 syntax" in message
    # \p{Lu} is RE2's (Python's re refuses it): saved, and it triggers the answer
    status, created = await _save(client, {"pattern": r"\b\p{Lu}{2}-\d{4}\b"})
    assert status == 201, created
    response = await client.patch(f"{CURATED}/{created['id']}", json={"pattern": r"(a)\1"})
    assert response.status == 400
    assert "invalid escape sequence" in (await response.json())["error"]["message"]
    listed = await (await client.get(CURATED)).json()
    assert [c["pattern"] for c in listed["items"]] == [r"\b\p{Lu}{2}-\d{4}\b"]
    events = await _playground(client, "Where is my order NK-2041?")
    done = next(data for name, data in events if name == "done")
    assert done["mode"] == "curated"
    assert done["answer"] == "Canned reply."


async def test_the_store_refuses_a_pattern_re2_cannot_match(client: Client) -> None:
    # what saves curated answers without the admin API (the console, scripts) is held to it too
    pool = client.server.app[DATABASE].pool
    agent = await Agents(pool).get("shop")
    curated = CuratedAnswers(pool)
    with pytest.raises(InvalidInput, match="RE2 syntax"):
        await curated.create(agent.id, "Canned reply.", pattern=r"(?=ahead)")
    new_id = await curated.create(agent.id, "Canned reply.", pattern=r"\p{Lu}{2}-\d{4}")
    with pytest.raises(InvalidInput, match="RE2 syntax"):
        await curated.update(agent.id, new_id, pattern=r"(a)\1")
    assert (await curated.get(agent.id, new_id)).pattern == r"\p{Lu}{2}-\d{4}"


async def test_healthz_is_not_held_up_while_a_turn_is_matched(client: Client) -> None:
    status, body = await _save(client, {"pattern": CATASTROPHIC})
    assert status == 201, body
    # A process's first turn like this loads a language identifier (seconds, once): a short
    # one first, so that what is measured is the matching.
    await _playground(client, "aaaa!")
    turn_over = asyncio.Event()
    waits: list[float] = []

    async def probe_health() -> None:
        # /healthz asked again and again for as long as the turn lasts: one is in flight
        # whenever the turn would hold the event loop
        while not turn_over.is_set():
            asked = time.perf_counter()
            response = await client.get("/healthz")
            assert response.status == 200
            waits.append(time.perf_counter() - asked)

    prober = asyncio.create_task(probe_health())
    started = time.perf_counter()
    try:
        events = await _playground(client, EVIL)
    finally:
        turn_over.set()
        await prober
    turn_seconds = time.perf_counter() - started
    done = next(data for name, data in events if name == "done")
    assert done["mode"] != "curated"  # the pattern does not match, and says so at once
    assert waits
    # generous bounds: a backtracking engine holds the whole process for many seconds
    assert max(waits) < 3.0
    assert turn_seconds < 10.0


async def _playground(client: Client, message: str) -> list[Any]:
    base = str(client.make_url("")).rstrip("/")
    events = []
    async with (
        httpx.AsyncClient(base_url=base, timeout=120) as http,
        aconnect_sse(http, "POST", "/api/v1/admin/agents/shop/playground",
                     json={"message": message}, headers={"Authorization": f"Bearer {TOKEN}"})
        as source,
    ):  # fmt: skip
        assert source.response.status_code == 200
        async for event in source.aiter_sse():
            events.append((event.event, json.loads(event.data)))
    return events
