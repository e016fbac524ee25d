"""The gateway built by create_app: health, readiness, metrics, errors and request ids."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from core.errors import EmbedderMismatch
from core.settings import Settings
from core.store import Agents, open_database
from core.store.vector_index import EmbedderIdentity
from gateway.app import create_app
from tests.conftest import MakeSettings
from tests.support.services import RedisServer, with_database

Client = TestClient[web.Request, web.Application]
MakeClient = Callable[[web.Application], Awaitable[Client]]


async def test_healthz(aiohttp_client: MakeClient, settings: Settings) -> None:
    client = await aiohttp_client(create_app(settings))
    response = await client.get("/healthz")
    assert response.status == 200
    assert await response.json() == {"status": "ok"}


async def test_readyz_reports_database_and_redis(
    aiohttp_client: MakeClient, settings: Settings
) -> None:
    client = await aiohttp_client(create_app(settings))
    response = await client.get("/readyz")
    assert response.status == 200
    assert await response.json() == {
        "status": "ready",
        "checks": {"database": "ok", "cache (redis)": "ok"},
    }


async def test_readyz_stays_200_and_reports_redis_degraded_when_it_stops(
    aiohttp_client: MakeClient, make_settings: MakeSettings, private_redis: RedisServer
) -> None:
    client = await aiohttp_client(create_app(make_settings(redis_url=private_redis.url)))
    assert (await client.get("/readyz")).status == 200
    private_redis.kill()
    response = await client.get("/readyz")
    assert response.status == 200  # a load balancer keeps the gateway: it still answers
    body = await response.json()
    assert body["status"] == "degraded"
    assert body["checks"]["database"] == "ok"
    assert body["checks"]["cache (redis)"].startswith("degraded: redis is unreachable")
    private_redis.start()
    assert await (await client.get("/readyz")).json() == {
        "status": "ready",
        "checks": {"database": "ok", "cache (redis)": "ok"},
    }


async def test_readyz_is_503_naming_the_database_when_it_goes(
    aiohttp_client: MakeClient, settings: Settings, postgres_url: str
) -> None:
    client = await aiohttp_client(create_app(settings))
    assert (await client.get("/readyz")).status == 200
    assert settings.database_url is not None
    name = urlsplit(settings.database_url.get_secret_value()).path.lstrip("/")
    admin = await asyncpg.connect(postgres_url)
    await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    await admin.close()
    response = await client.get("/readyz")
    assert response.status == 503
    message = (await response.json())["error"]["message"]
    assert message.startswith("not ready: database")
    assert "redis" not in message


async def test_the_in_process_cache_serves_without_redis(
    aiohttp_client: MakeClient, make_settings: MakeSettings
) -> None:
    client = await aiohttp_client(create_app(make_settings(redis_url=None)))
    body = await (await client.get("/readyz")).json()
    assert body["checks"]["cache (local)"] == "ok"


async def test_metrics_count_requests_by_route_with_latency(
    aiohttp_client: MakeClient, settings: Settings
) -> None:
    client = await aiohttp_client(create_app(settings))
    for _ in range(3):
        await client.get("/healthz")
    await client.get("/no/such/page")
    response = await client.get("/metrics")
    assert response.status == 200
    assert response.headers["Content-Type"].startswith("text/plain")
    text = await response.text()
    assert 'parley_http_requests_total{method="GET",route="/healthz",status="200"} 3.0' in text
    assert 'route="unmatched",status="404"' in text
    assert re.search(
        r'parley_http_request_duration_seconds_count\{method="GET",route="/healthz"\} 3\.0', text
    )
    assert (
        'parley_http_request_duration_seconds_bucket{le="0.005",method="GET",route="/healthz"}'
        in text
    )


async def test_errors_are_json(aiohttp_client: MakeClient, settings: Settings) -> None:
    client = await aiohttp_client(create_app(settings))
    missing = await client.get("/no/such/page")
    assert missing.status == 404
    assert (await missing.json())["error"]["code"] == "not_found"
    wrong_method = await client.post("/healthz")
    assert wrong_method.status == 405
    assert wrong_method.headers["Allow"] == "GET,HEAD" or "GET" in wrong_method.headers["Allow"]
    body = await wrong_method.json()
    assert body == {"error": {"code": "method_not_allowed", "message": "Method Not Allowed"}}


async def test_request_ids_are_echoed_or_made(
    aiohttp_client: MakeClient, settings: Settings
) -> None:
    client = await aiohttp_client(create_app(settings))
    given = await client.get("/healthz", headers={"X-Request-Id": "abc-123"})
    assert given.headers["X-Request-Id"] == "abc-123"
    made = await client.get("/healthz")
    assert re.fullmatch(r"[0-9a-f]{32}", made.headers["X-Request-Id"])
    hostile = await client.get("/healthz", headers={"X-Request-Id": "x\u2028<script>"})
    assert hostile.headers["X-Request-Id"] != "x\u2028<script>"


async def test_start_refuses_an_embedder_that_does_not_match_stored_vectors(
    settings: Settings, make_settings: MakeSettings
) -> None:
    database = await open_database(settings)
    agent = await Agents(database.pool).create(
        "shop", embedder=EmbedderIdentity("use:universal-sentence-encoder-multilingual-3", 512)
    )
    async with database.pool.acquire() as conn:
        source = await conn.fetchval(
            "INSERT INTO sources (agent_id, kind, location) VALUES ($1, 'text', 'x') RETURNING id",
            agent.id,
        )
        page = await conn.fetchval(
            "INSERT INTO pages (agent_id, source_id, url, content_hash) VALUES ($1, $2, 'u', '\\x00') RETURNING id",
            agent.id,
            source,
        )
        await conn.execute(
            "INSERT INTO chunks (agent_id, page_id, ord, text, embedding) VALUES ($1, $2, 0, 't', $3)",
            agent.id,
            page,
            [0.1] * 512,
        )
    await database.close()
    runner = web.AppRunner(create_app(make_settings(embed_provider="openai")))
    with pytest.raises(EmbedderMismatch, match="rebuild-index --agent shop"):
        await runner.setup()
    await runner.cleanup()


def test_with_database_swaps_only_the_name() -> None:
    assert (
        with_database("postgresql://u:p@h:5/a?sslmode=off", "b")
        == "postgresql://u:p@h:5/b?sslmode=off"
    )
    assert Path("x").name == "x"


async def test_the_language_models_are_read_at_start_not_by_the_first_turn(
    aiohttp_client: MakeClient, settings: Settings
) -> None:
    # Reading them takes a second or two and blocks: in a turn it would stall every chat.
    from core import locale
    from core.answer import question

    question._model.cache_clear()
    question._identifier.cache_clear()
    locale._identifier = None
    await aiohttp_client(create_app(settings))
    assert question._model.cache_info().currsize == 1
    assert locale._identifier is not None
    # A short message's language among a few candidates is a copy of the model read once.
    assert question.guess_language("Was kostet die Jacke?") == "de"
    assert question._model.cache_info().misses == 1
