"""Vector search on half-precision vectors: filters that exclude most chunks still get the
nearest permitted ones, a larger agent searches its graph with a longer candidate list,
migration 0023 keeps existing chunks searchable, and embedders of more than 2,000 dimensions
get an index too."""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg
import numpy as np
from numpy.typing import NDArray
from pgvector.asyncpg import register_vector

from core.settings import Settings
from core.store import Agents, Database, open_database
from core.store.migrate import bundled_migrations, migrate
from core.store.search import ChunkSearch, SearchFilters
from core.store.vector_index import EfSearch, EmbedderIdentity, hnsw_session, index_name

USE = EmbedderIdentity("use:universal-sentence-encoder-multilingual-3", 512)
LARGE = EmbedderIdentity("openai:text-embedding-3-large", 3072)
TINY = EmbedderIdentity("openai:tiny-test-model", 3)


def _unit(rows: NDArray[np.float64]) -> NDArray[np.float32]:
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


def _nearest(
    vectors: NDArray[np.float32], query: NDArray[np.float32], allowed: Sequence[int], k: int
) -> list[int]:
    """Positions of the k allowed vectors nearest to the query, as half precision ranks them."""
    half = vectors.astype(np.float16).astype(np.float32)
    similarity = half[list(allowed)] @ query.astype(np.float16).astype(np.float32)
    similarity /= np.linalg.norm(half[list(allowed)], axis=1)
    order = np.argsort(-similarity)[:k]
    return [allowed[i] for i in order]


async def _add_chunks(
    conn: asyncpg.Connection,
    agent_id: int,
    vectors: NDArray[np.float32],
    visibility: Sequence[str] | None = None,
    tags: Sequence[list[str]] | None = None,
) -> list[int]:
    """One page holding a chunk per vector; returns the chunk ids in vector order."""
    source = await conn.fetchval(
        "INSERT INTO sources (agent_id, kind, location) VALUES ($1, 'text', 'test') RETURNING id",
        agent_id,
    )
    page = await conn.fetchval(
        """INSERT INTO pages (agent_id, source_id, url, title, locale, content_hash)
           VALUES ($1, $2, $3, 'Catalogue', 'en', '\\x00') RETURNING id""",
        agent_id,
        source,
        f"https://shop.example/catalogue/{agent_id}",
    )
    await conn.copy_records_to_table(
        "chunks",
        columns=["agent_id", "page_id", "ord", "text", "locale", "visibility", "tags", "embedding"],
        records=[
            (
                agent_id,
                page,
                i,
                f"Product {i} sheet",
                "en",
                visibility[i] if visibility else "public",
                tags[i] if tags else [],
                vector,
            )
            for i, vector in enumerate(vectors)
        ],
    )
    rows = await conn.fetch("SELECT id FROM chunks WHERE page_id = $1 ORDER BY ord", page)
    return [r["id"] for r in rows]


async def test_a_filter_that_excludes_most_chunks_still_gets_the_nearest_permitted(
    database: Database, settings: Settings
) -> None:
    """30 chunks left among 3,000 once the discontinued products are excluded: the HNSW scan
    goes on past the excluded ones until it has the k nearest. The planner is kept on the
    index, as on a table of a million chunks (on 3,000 it would rather sort them all)."""
    shop = await Agents(database.pool).create("shop", embedder=USE)
    rng = np.random.default_rng(11)
    vectors = _unit(rng.normal(size=(3000, 512)))
    current = sorted(rng.choice(3000, size=30, replace=False).tolist())
    tags = [[] if i in current else ["discontinued"] for i in range(3000)]
    async with database.pool.acquire() as conn:
        ids = await _add_chunks(conn, shop.id, vectors, tags=tags)
        name = await conn.fetchval("SELECT current_database()")
        await conn.execute(f'ALTER DATABASE "{name}" SET enable_seqscan = off')
        await conn.execute(f'ALTER DATABASE "{name}" SET enable_bitmapscan = off')
    large = await open_database(settings, apply_migrations=False)
    try:
        search = ChunkSearch(large.pool)
        leave_out = SearchFilters(exclude_tags=("discontinued",))
        for query in _unit(rng.normal(size=(5, 512))):
            found = await search.dense(shop.id, 512, query, 10, leave_out)
            nearest = _nearest(vectors, query, current, 10)
            assert [c.chunk_id for c in found] == [ids[i] for i in nearest]
            assert all(c.url.endswith(f"/catalogue/{shop.id}") for c in found)
        async with large.pool.acquire() as conn:
            plan = "\n".join(
                r[0]
                for r in await conn.fetch(
                    "EXPLAIN SELECT id FROM chunks WHERE agent_id = $1 "
                    "AND NOT (tags && '{discontinued}') "
                    "ORDER BY embedding::halfvec(512) <=> $2 LIMIT 10",
                    shop.id,
                    vectors[0],
                )
            )
        assert index_name(shop.id) in plan
    finally:
        await large.close()


async def test_an_agent_past_the_size_bar_searches_with_the_longer_candidate_list(
    database: Database,
) -> None:
    """3,000 scattered vectors: a graph search keeping 10 candidates misses some of the ten
    nearest; once the agent's index is past the bar, its searches keep 400 and find them."""
    shop = await Agents(database.pool).create("shop", embedder=USE)
    rng = np.random.default_rng(14)
    vectors = _unit(rng.normal(size=(3000, 512)))
    async with database.pool.acquire() as conn:
        ids = await _add_chunks(conn, shop.id, vectors)
        await conn.execute("VACUUM ANALYZE chunks")  # the index's size, as autovacuum keeps it
    # Connections started as Parley's are, with the short list; kept on the index as on a
    # big table (on 3,000 rows the planner would rather sort them all).
    pool = await asyncpg.create_pool(
        database.url,
        min_size=1,
        max_size=2,
        init=register_vector,
        server_settings={"enable_seqscan": "off", **hnsw_session(ef_search=10)},
    )
    assert pool is not None
    queries = _unit(rng.normal(size=(5, 512)))
    nearest = [[ids[i] for i in _nearest(vectors, q, range(3000), 10)] for q in queries]

    async def found(search: ChunkSearch) -> list[list[int]]:
        return [
            [c.chunk_id for c in await search.dense(shop.id, 512, q, 10, SearchFilters())]
            for q in queries
        ]

    try:
        below = ChunkSearch(pool, EfSearch(small=10, large=400, large_from=5_000))
        past = ChunkSearch(pool, EfSearch(small=10, large=400, large_from=2_000))
        assert await below.ef_search(shop.id) == 10
        assert await past.ef_search(shop.id) == 400
        short = await found(below)
        assert sum(len(set(f) & set(n)) for f, n in zip(short, nearest, strict=True)) < 50
        assert await found(past) == nearest
        # The longer list was the transaction's alone: the connections keep the short one.
        assert await pool.fetchval("SHOW hnsw.ef_search") == "10"
    finally:
        await pool.close()


async def test_a_tag_on_few_chunks_gets_the_nearest_tagged_ones(database: Database) -> None:
    shop = await Agents(database.pool).create("shop", embedder=USE)
    rng = np.random.default_rng(12)
    vectors = _unit(rng.normal(size=(2000, 512)))
    on_sale = sorted(rng.choice(2000, size=25, replace=False).tolist())
    tags = [["sale", "shoes"] if i in on_sale else ["shoes"] for i in range(2000)]
    async with database.pool.acquire() as conn:
        ids = await _add_chunks(conn, shop.id, vectors, tags=tags)
    search = ChunkSearch(database.pool)
    query = _unit(rng.normal(size=(1, 512)))[0]
    found = await search.dense(shop.id, 512, query, 8, SearchFilters(include_tags=("sale",)))
    assert [c.chunk_id for c in found] == [ids[i] for i in _nearest(vectors, query, on_sale, 8)]
    assert all("sale" in c.tags for c in found)


async def test_an_embedder_of_3072_dimensions_gets_an_index(database: Database) -> None:
    """Single-precision HNSW stops at 2,000 dimensions; half precision goes to 4,000."""
    shop = await Agents(database.pool).create("shop", embedder=LARGE)
    rng = np.random.default_rng(13)
    vectors = _unit(rng.normal(size=(50, 3072)))
    async with database.pool.acquire() as conn:
        ids = await _add_chunks(conn, shop.id, vectors)
        indexdef = await conn.fetchval(
            "SELECT indexdef FROM pg_indexes WHERE indexname = $1", index_name(shop.id)
        )
    assert "halfvec(3072)" in indexdef
    assert "hnsw" in indexdef
    found = await ChunkSearch(database.pool).dense(shop.id, 3072, vectors[17], 3, SearchFilters())
    assert found[0].chunk_id == ids[17]
    assert found[0].dense > 0.99


async def _agent_of_an_older_parley(
    conn: asyncpg.Connection, slug: str, embedder: EmbedderIdentity
) -> int:
    """An agent with its index as Parley built it before migration 0023 (single precision)."""
    agent_id: int = await conn.fetchval(
        """INSERT INTO agents (slug, name, widget_key, embedder, embedding_dim)
           VALUES ($1, $1, $2, $3, $4) RETURNING id""",
        slug,
        f"wk-{slug}",
        embedder.name,
        embedder.dimension,
    )
    await conn.execute(
        f"CREATE INDEX {index_name(agent_id)} ON chunks "
        f"USING hnsw ((embedding::vector({embedder.dimension})) vector_cosine_ops) "
        f"WITH (m = 16, ef_construction = 64) WHERE agent_id = {agent_id}"
    )
    return agent_id


async def test_migration_0023_keeps_existing_chunks_searchable(fresh_database: str) -> None:
    """Two agents on embedders of different sizes, their chunks stored as single precision:
    after the migration both still find their own chunks, through an index of their own."""
    conn = await asyncpg.connect(fresh_database)
    rng = np.random.default_rng(14)
    shop_vectors = _unit(rng.normal(size=(40, 512)))
    tiny_vectors = _unit(rng.normal(size=(10, 3)))
    try:
        await migrate(conn, [m for m in bundled_migrations() if m.version < 23])
        await register_vector(conn)
        assert (
            await conn.fetchval(
                "SELECT format_type(atttypid, atttypmod) FROM pg_attribute "
                "WHERE attrelid = 'chunks'::regclass AND attname = 'embedding'"
            )
            == "vector"
        )
        shop = await _agent_of_an_older_parley(conn, "shop", USE)
        tiny = await _agent_of_an_older_parley(conn, "tiny", TINY)
        shop_ids = await _add_chunks(conn, shop, shop_vectors)
        tiny_ids = await _add_chunks(conn, tiny, tiny_vectors)

        assert 23 in await migrate(conn)
        assert (
            await conn.fetchval(
                "SELECT format_type(atttypid, atttypmod) FROM pg_attribute "
                "WHERE attrelid = 'chunks'::regclass AND attname = 'embedding'"
            )
            == "halfvec"
        )
        for agent, dim in [(shop, 512), (tiny, 3)]:
            indexdef = await conn.fetchval(
                "SELECT indexdef FROM pg_indexes WHERE indexname = $1", index_name(agent)
            )
            assert f"halfvec({dim})) halfvec_cosine_ops" in indexdef
            assert f"agent_id = {agent}" in indexdef
    finally:
        await conn.close()

    database = await open_database(
        Settings(_env_file=None, database_url=fresh_database)  # type: ignore[call-arg]
    )
    try:
        search = ChunkSearch(database.pool)
        found = await search.dense(shop, 512, shop_vectors[7], 5, SearchFilters())
        assert found[0].chunk_id == shop_ids[7]
        assert {c.chunk_id for c in found} <= set(shop_ids)
        found = await search.dense(tiny, 3, tiny_vectors[2], 3, SearchFilters())
        assert found[0].chunk_id == tiny_ids[2]
        assert {c.chunk_id for c in found} <= set(tiny_ids)
        words = await search.lexical(
            shop, 512, shop_vectors[7], "product 7 sheet", "en", 5, SearchFilters()
        )
        assert words[0].chunk_id == shop_ids[7]
        assert words[0].dense > 0.99
    finally:
        await database.close()
