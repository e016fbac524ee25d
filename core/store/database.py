"""The asyncpg pool: to `PARLEY_DATABASE_URL`, or to the embedded PostgreSQL when it is unset."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from urllib.parse import urlsplit

import asyncpg
from asyncpg.pool import PoolConnectionProxy
from pgvector.asyncpg import register_vector

from core.errors import StoreUnavailable
from core.settings import Settings
from core.store.embedded import EmbeddedPostgres
from core.store.migrate import migrate
from core.store.vector_index import hnsw_session

log = logging.getLogger(__name__)

_CONNECT_TIMEOUT = 10.0

# A plain connection or one borrowed from the pool: repositories accept either.
Connection = asyncpg.Connection | PoolConnectionProxy

# Every id column is a bigint counted from 1. asyncpg refuses to send a larger number at all,
# so an id from a request is checked against this before it reaches a query.
MAX_ID = 2**63 - 1


def describe_url(url: str) -> str:
    """host:port/database of a URL, without user or password, for messages and logs."""
    parts = urlsplit(url)
    host = parts.hostname or "local socket"
    port = f":{parts.port}" if parts.port else ""
    return f"{host}{port}{parts.path or '/'}"


async def _init_connection(conn: asyncpg.Connection) -> None:
    await register_vector(conn)
    for kind in ("json", "jsonb"):
        await conn.set_type_codec(kind, encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


@dataclass
class Database:
    """The pool every repository uses, and the embedded server behind it when there is one."""

    pool: asyncpg.Pool
    url: str
    embedded: EmbeddedPostgres | None = None

    @property
    def description(self) -> str:
        return "embedded PostgreSQL" if self.embedded else describe_url(self.url)

    async def ping(self, within: float = 2.0) -> None:
        """Raise `StoreUnavailable` unless the database answers a trivial query in time."""
        try:
            async with asyncio.timeout(within):
                await self.pool.fetchval("SELECT 1")
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError) as exc:
            raise StoreUnavailable(f"database is unreachable ({type(exc).__name__})") from exc

    async def close(self) -> None:
        try:
            await asyncio.wait_for(self.pool.close(), timeout=10)
        except TimeoutError:
            self.pool.terminate()
        if self.embedded is not None:
            await self.embedded.stop()


async def connect(url: str) -> asyncpg.Connection:
    """One connection, with unreachable servers reported as `StoreUnavailable`."""
    try:
        conn: asyncpg.Connection = await asyncpg.connect(url, timeout=_CONNECT_TIMEOUT)
        return conn
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise StoreUnavailable(
            f"cannot reach the database at {describe_url(url)}: {reason}"
        ) from exc


async def open_database(
    settings: Settings, *, apply_migrations: bool = True, min_size: int = 1, max_size: int = 10
) -> Database:
    """Open the pool, starting the embedded server first when no URL is configured.

    Migrations run on a single connection before the pool exists, because the pool's
    connections register the pgvector type, which the first migration creates.
    """
    embedded = None
    if settings.database_url is not None:
        url = settings.database_url.get_secret_value()
    else:
        embedded = EmbeddedPostgres(settings.data_dir)
        url = await embedded.start()
    try:
        if apply_migrations:
            conn = await connect(url)
            try:
                await migrate(conn)
            finally:
                await conn.close()
        try:
            pool = await asyncpg.create_pool(
                url,
                min_size=min_size,
                max_size=max_size,
                init=_init_connection,
                timeout=_CONNECT_TIMEOUT,
                # Per-agent partial vector indexes are only usable with the agent id
                # known at planning time, so never let a generic plan take over.
                server_settings={"plan_cache_mode": "force_custom_plan", **hnsw_session()},
            )
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise StoreUnavailable(
                f"cannot reach the database at {describe_url(url)}: {exc}"
            ) from exc
    except BaseException:
        if embedded is not None:
            await embedded.stop()
        raise
    log.info("store.opened database=%s", "embedded" if embedded else describe_url(url))
    return Database(pool=pool, url=url, embedded=embedded)
