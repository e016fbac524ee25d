"""The gateway that `parley serve --demo` runs, built by the production `create_app` for browser tests."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from playwright.async_api import Browser

from core.settings import Settings
from gateway.app import create_app
from gateway.commands.serve import prepare_demo
from gateway.demo import DemoSite
from tests.e2e.browser import chromium
from tests.fakes.openai import FakeOpenAI
from tests.support.services import RedisServer, with_database

MODEL = "gpt-4o-mini"


@dataclass
class Gateway:
    url: str
    demo: DemoSite
    app: web.Application


async def _admin(url: str, statement: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


def _settings(database_url: str, data_dir: Path, **overrides: Any) -> Settings:
    values = {"database_url": database_url, "data_dir": data_dir, **overrides}
    return Settings(_env_file=None, **values)  # type: ignore[call-arg]


@pytest.fixture(scope="module")
def demo_database(
    postgres_url: str, template_database: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, DemoSite]]:
    """A database where `prepare_demo` created agent `demo` and ingested the sample shop.

    Ingesting the shop is the slow part, so it happens once per module; each test works on
    a copy.
    """
    name = f"t_demo_{uuid.uuid4().hex[:12]}"
    asyncio.run(_admin(postgres_url, f'CREATE DATABASE "{name}" TEMPLATE "{template_database}"'))
    settings = _settings(with_database(postgres_url, name), tmp_path_factory.mktemp("demo"))
    demo = asyncio.run(prepare_demo(settings))
    yield name, demo
    asyncio.run(_admin(postgres_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture
def demo_copy(postgres_url: str, demo_database: tuple[str, DemoSite]) -> Iterator[str]:
    """This test's own copy of the demo database, so it may add pages."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    asyncio.run(_admin(postgres_url, f'CREATE DATABASE "{name}" TEMPLATE "{demo_database[0]}"'))
    yield with_database(postgres_url, name)
    asyncio.run(_admin(postgres_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@dataclass
class FakeLlm:
    fake: FakeOpenAI
    url: str


@pytest.fixture
async def llm() -> AsyncIterator[FakeLlm]:
    fake = FakeOpenAI()
    server = TestServer(fake.app())
    await server.start_server()
    yield FakeLlm(fake, str(server.make_url("/v1")))
    await server.close()


StartGateway = Callable[..., Awaitable[Gateway]]


@pytest.fixture
async def start_gateway(
    demo_database: tuple[str, DemoSite],
    demo_copy: str,
    private_redis: RedisServer,
    tmp_path: Path,
    llm: FakeLlm,
) -> AsyncIterator[StartGateway]:
    """Starts what `parley serve --demo` runs, answering extractively or with the fake LLM."""
    servers: list[TestServer] = []

    async def start(*, with_llm: bool) -> Gateway:
        options: dict[str, Any] = {"redis_url": private_redis.url}
        if with_llm:
            options |= {"llm_base_url": llm.url, "llm_api_key": "sk-test", "llm_model": MODEL}
        settings = _settings(demo_copy, tmp_path / "data", **options)
        demo = demo_database[1]
        server = TestServer(create_app(settings, demo))
        await server.start_server()
        servers.append(server)
        return Gateway(str(server.make_url("")).rstrip("/"), demo, server.app)

    yield start
    for server in servers:
        await server.close()


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with chromium() as launched:
        yield launched
