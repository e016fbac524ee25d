"""Migrations, agents and per-agent vector indexes on a real PostgreSQL with pgvector."""

from __future__ import annotations

import asyncio

import asyncpg
import numpy as np
import pytest
from pgvector.asyncpg import register_vector

from core.errors import AgentNotFound, ConfigError, Conflict, EmbedderMismatch, InvalidInput
from core.store import Agents, Database
from core.store.migrate import Migration, bundled_migrations, migrate
from core.store.vector_index import EmbedderIdentity, check_embedders, index_name

USE = EmbedderIdentity("use:universal-sentence-encoder-multilingual-3", 512)
OPENAI = EmbedderIdentity("openai:text-embedding-3-small", 1536)

TABLES = {
    "agents",
    "api_keys",
    "sources",
    "pages",
    "chunks",
    "conversations",
    "messages",
    "summaries",
    "turns",
    "content_gaps",
    "curated_answers",
    "inbox",
    "outbox",
    "usage",
}


async def test_migrations_on_a_fresh_database_then_a_second_run(fresh_database: str) -> None:
    conn = await asyncpg.connect(fresh_database)
    try:
        applied = await migrate(conn)
        assert applied == [m.version for m in bundled_migrations()]
        tables = {
            r["tablename"]
            for r in await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        }
        assert TABLES | {"schema_migrations"} <= tables
        assert await conn.fetchval("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
        assert await migrate(conn) == []  # idempotent
        assert await conn.fetchval("SELECT count(*) FROM schema_migrations") == len(applied)
    finally:
        await conn.close()


async def test_concurrent_migrations_apply_each_file_once(fresh_database: str) -> None:
    conns = [await asyncpg.connect(fresh_database) for _ in range(4)]
    try:
        results = await asyncio.gather(*(migrate(c) for c in conns))
        assert sorted(len(r) for r in results) == [0, 0, 0, len(bundled_migrations())]
        rows = await conns[0].fetch("SELECT version FROM schema_migrations")
        assert len(rows) == len(bundled_migrations())
    finally:
        for conn in conns:
            await conn.close()


async def test_an_edited_migration_stops_the_start(fresh_database: str) -> None:
    conn = await asyncpg.connect(fresh_database)
    try:
        await migrate(conn)
        first = bundled_migrations()[0]
        edited = [Migration(first.version, first.name, first.sql + "\n-- changed\n")]
        with pytest.raises(ConfigError, match="was changed after it was applied"):
            await migrate(conn, edited)
    finally:
        await conn.close()


async def test_a_failing_migration_leaves_no_trace(fresh_database: str) -> None:
    conn = await asyncpg.connect(fresh_database)
    try:
        await migrate(conn)
        broken = [
            *bundled_migrations(),
            Migration(9999, "broken", "CREATE TABLE half (id int); SELECT 1/0;"),
        ]
        with pytest.raises(asyncpg.DivisionByZeroError):
            await migrate(conn, broken)
        assert await conn.fetchval("SELECT to_regclass('half')") is None
        assert (
            await conn.fetchval("SELECT count(*) FROM schema_migrations WHERE version = 9999") == 0
        )
    finally:
        await conn.close()


async def test_create_and_read_agents(database: Database) -> None:
    agents = Agents(database.pool)
    shop = await agents.create("shop", embedder=USE, language="nl", timezone="Europe/Amsterdam")
    assert (shop.slug, shop.default_language, shop.timezone) == ("shop", "nl", "Europe/Amsterdam")
    assert shop.widget_key.startswith("pk_")
    assert (shop.embedder, shop.embedding_dim) == (USE.name, 512)
    other = await agents.create("help-desk", embedder=USE, name="Help desk")
    assert other.widget_key != shop.widget_key
    assert [a.slug for a in await agents.list()] == ["help-desk", "shop"]
    assert (await agents.get("shop")).id == shop.id
    with pytest.raises(AgentNotFound):
        await agents.get("nope")
    with pytest.raises(Conflict, match="already exists"):
        await agents.create("shop", embedder=USE)


@pytest.mark.parametrize(
    ("slug", "language", "timezone", "complaint"),
    [
        ("Shop Name", "en", "UTC", "lowercase letters"),
        ("shop", "dutch", "UTC", "language"),
        ("shop", "en", "Mars/Olympus", "IANA time zone"),
    ],
)
async def test_agent_input_is_validated(
    database: Database, slug: str, language: str, timezone: str, complaint: str
) -> None:
    with pytest.raises(InvalidInput, match=complaint):
        await Agents(database.pool).create(slug, embedder=USE, language=language, timezone=timezone)
    assert await Agents(database.pool).list() == []


async def _add_chunk(conn: asyncpg.Connection, agent_id: int, vector: np.ndarray, text: str) -> int:
    await register_vector(conn)
    source = await conn.fetchval(
        "INSERT INTO sources (agent_id, kind, location) VALUES ($1, 'text', $2) RETURNING id",
        agent_id,
        f"inline:{text}",
    )
    page = await conn.fetchval(
        """INSERT INTO pages (agent_id, source_id, url, title, locale, content_hash)
           VALUES ($1, $2, $3, 'Page', 'en', '\\x00') RETURNING id""",
        agent_id,
        source,
        f"https://shop.example/{text}",
    )
    chunk_id: int = await conn.fetchval(
        """INSERT INTO chunks (agent_id, page_id, ord, text, locale, embedding)
           VALUES ($1, $2, 0, $3, 'en', $4) RETURNING id""",
        agent_id,
        page,
        text,
        vector,
    )
    return chunk_id


async def test_each_agent_has_an_hnsw_index_the_planner_uses(database: Database) -> None:
    agents = Agents(database.pool)
    shop = await agents.create("shop", embedder=USE)
    rng = np.random.default_rng(7)
    async with database.pool.acquire() as conn:
        for i in range(3):
            await _add_chunk(conn, shop.id, rng.normal(size=512).astype(np.float32), f"c{i}")
        indexdef = await conn.fetchval(
            "SELECT indexdef FROM pg_indexes WHERE indexname = $1", index_name(shop.id)
        )
        assert "hnsw" in indexdef
        assert "halfvec(512)" in indexdef
        assert f"agent_id = {shop.id}" in indexdef
        await conn.execute("SET enable_seqscan = off")
        plan = "\n".join(
            r[0]
            for r in await conn.fetch(
                "EXPLAIN SELECT id FROM chunks WHERE agent_id = $1 "
                "ORDER BY embedding::halfvec(512) <=> $2 LIMIT 5",
                shop.id,
                rng.normal(size=512).astype(np.float32),
            )
        )
        assert index_name(shop.id) in plan


async def test_embedder_change_with_stored_vectors_refuses_to_start(database: Database) -> None:
    agents = Agents(database.pool)
    shop = await agents.create("shop", embedder=USE)
    empty = await agents.create("empty", embedder=USE)
    async with database.pool.acquire() as conn:
        await _add_chunk(conn, shop.id, np.ones(512, dtype=np.float32), "returns")
        await check_embedders(conn, USE)  # same embedder: fine

        with pytest.raises(EmbedderMismatch) as caught:
            await check_embedders(conn, OPENAI)
        message = caught.value.message
        assert "'shop'" in message
        assert "512 dimensions" in message
        assert "1536 dimensions" in message
        assert "parley rebuild-index --agent shop" in message
        # Nothing was lost: the stored vectors and the old index are still there.
        assert await conn.fetchval("SELECT count(*) FROM chunks WHERE agent_id = $1", shop.id) == 1
        assert (await agents.get("shop")).embedding_dim == 512

    # An agent with no content yet simply follows the configured embedder.
    rebound = await agents.get("empty")
    assert (rebound.embedder, rebound.embedding_dim) == (OPENAI.name, 1536)
    indexdef = await database.pool.fetchval(
        "SELECT indexdef FROM pg_indexes WHERE indexname = $1", index_name(empty.id)
    )
    assert "halfvec(1536)" in indexdef
