"""Each agent's HNSW index, built for the vector size of the embedder its content came from.

The `chunks.embedding` column (halfvec) has no fixed size, so agents on different embedders can
live in one table; each agent gets a partial index on ``(embedding::halfvec(N))`` restricted to
its own rows (pgvector's documented pattern). That also keeps an agent's ANN search from being
diluted by other agents' rows.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from core.errors import EmbedderMismatch
from core.ports import Embedder

if TYPE_CHECKING:
    # Only for annotations: core.store.database imports this module for hnsw_session.
    from core.store.database import Connection

log = logging.getLogger(__name__)

# HNSW build parameters (migration 0023 builds with the same); see bench/retrieval.py for the
# recall they give and what larger ones cost.
HNSW_M = 16
HNSW_EF_CONSTRUCTION = 64
INDEX_PREFIX = "chunks_embedding_agent_"


# HNSW search settings. ef_search is the candidate list of one graph search: the larger, the
# nearer the found chunks are to the exact nearest, and the longer the search. The recall a
# list gives falls as the index grows, so it goes by the size of the agent's index: on
# clustered 512-dimension chunks (bench/retrieval.py) recall@10 against exact search is 1.00
# at 100k chunks with 100, while a million need 400 for 0.95 (0.92 at 200), four times the
# work. Every pooled connection starts with the small list (see `hnsw_session`), so an
# agent's ANN query is a single round trip; an agent with more than EfSearch.large_from
# chunks gets the large one for its query's transaction (see ChunkSearch.dense).
# Filters (visibility, tags, language folder) are checked as the scan goes; when they leave
# fewer rows than asked, the iterative scan searches on (results in relaxed order, which
# ChunkSearch.dense re-sorts) until the LIMIT is met or MAX_SCAN_TUPLES index entries were
# looked at, so a filter that leaves few rows still gets its nearest permitted chunks, at a
# bounded cost.
@dataclass(frozen=True, slots=True)
class EfSearch:
    """The HNSW candidate list by the number of chunks in the agent's index."""

    small: int = 100
    large: int = 400
    large_from: int = 200_000

    @classmethod
    def fixed(cls, ef_search: int) -> EfSearch:
        """One list whatever the size (benchmarks that compare lists)."""
        return cls(small=ef_search, large=ef_search)

    def for_chunks(self, chunks: float) -> int:
        return self.large if chunks > self.large_from else self.small


EF_SEARCH = EfSearch()
MAX_SCAN_TUPLES = 40_000


def hnsw_session(
    ef_search: int = EF_SEARCH.small, max_scan_tuples: int = MAX_SCAN_TUPLES
) -> dict[str, str]:
    """The pgvector settings every pooled connection starts with."""
    return {
        "hnsw.ef_search": str(int(ef_search)),
        "hnsw.iterative_scan": "relaxed_order",
        "hnsw.max_scan_tuples": str(int(max_scan_tuples)),
    }


# pgvector builds fastest with the whole graph in maintenance_work_mem; above that it goes on
# on disk, several times slower. The build asks for what the agent's graph needs, up to this,
# where the server allows less.
BUILD_MEMORY_LIMIT = 2 * 1024**3
_MEMORY_UNIT = 1024**2


@dataclass(frozen=True, slots=True)
class EmbedderIdentity:
    """What an index was built with; vectors of two identities never mix in one index."""

    name: str  # "provider:model"
    dimension: int

    @classmethod
    def of(cls, embedder: Embedder) -> EmbedderIdentity:
        return cls(embedder.name, embedder.dimension)


def index_name(agent_id: int) -> str:
    return f"{INDEX_PREFIX}{int(agent_id)}"


@dataclass(frozen=True, slots=True)
class BuildProgress:
    """Where a running CREATE INDEX is (pg_stat_progress_create_index)."""

    phase: str
    blocks_done: int
    blocks_total: int
    tuples_done: int
    tuples_total: int

    def __str__(self) -> str:
        blocks = f"{self.blocks_done:,} / {self.blocks_total:,} blocks"
        if self.blocks_total:
            blocks += f" ({100 * self.blocks_done / self.blocks_total:.0f}%)"
        tuples = f"{self.tuples_done:,}"
        if self.tuples_total:
            tuples += f" / {self.tuples_total:,}"
        return f"{self.phase}: {blocks}, {tuples} tuples"


async def build_progress(conn: Connection, pid: int) -> BuildProgress | None:
    """The progress of the index build running in backend ``pid``, None when there is none."""
    row = await conn.fetchrow(
        """SELECT phase, blocks_done, blocks_total, tuples_done, tuples_total
             FROM pg_stat_progress_create_index WHERE pid = $1""",
        pid,
    )
    return None if row is None else BuildProgress(**dict(row))


def graph_bytes(rows: int, dimension: int, m: int = HNSW_M) -> int:
    """About what pgvector's in-memory HNSW graph takes for ``rows`` vectors of a dimension:
    the half-precision vector, the neighbour lists of its layers and their headers (a build
    of 512-dimension vectors with m=16 outgrew 2 GB after 0.92 million: 2.3 KB each)."""
    return int(rows) * (2 * int(dimension) + 8 + 48 * int(m) + 500)


@dataclass(frozen=True, slots=True)
class HnswBuild:
    """How an agent's index is built (the defaults everywhere but in bench/retrieval.py)."""

    m: int = HNSW_M
    ef_construction: int = HNSW_EF_CONSTRUCTION
    memory_limit: int = BUILD_MEMORY_LIMIT


async def bind_embedder(
    conn: Connection,
    agent_id: int,
    embedder: EmbedderIdentity,
    build: HnswBuild = HnswBuild(),
) -> None:
    """Record the agent's embedder and (re)build its vector index for that size.

    The caller makes sure the agent's chunks (if any) are of that size, as rebuild-index does.
    """
    dim = int(embedder.dimension)
    name = index_name(agent_id)
    async with conn.transaction():
        await conn.execute(
            "UPDATE agents SET embedder = $2, embedding_dim = $3, updated_at = now() WHERE id = $1",
            agent_id,
            embedder.name,
            dim,
        )
        await conn.execute(f"DROP INDEX IF EXISTS {name}")
        await _build_memory(conn, agent_id, dim, build)
        # Identifiers and sizes are integers we made, never user text.
        await conn.execute(
            f"CREATE INDEX {name} ON chunks "
            f"USING hnsw ((embedding::halfvec({dim})) halfvec_cosine_ops) "
            f"WITH (m = {int(build.m)}, ef_construction = {int(build.ef_construction)}) "
            f"WHERE agent_id = {int(agent_id)}"
        )


async def _build_memory(conn: Connection, agent_id: int, dimension: int, build: HnswBuild) -> None:
    """Raise maintenance_work_mem for this transaction to what the graph needs (see
    BUILD_MEMORY_LIMIT); a server set higher keeps its own."""
    rows = await conn.fetchval("SELECT count(*) FROM chunks WHERE agent_id = $1", agent_id)
    current = await conn.fetchval(
        "SELECT setting::bigint * 1024 FROM pg_settings WHERE name = 'maintenance_work_mem'"
    )
    wanted = min(build.memory_limit, graph_bytes(rows, dimension, build.m))
    if wanted > current:
        megabytes = -(-wanted // _MEMORY_UNIT)
        await conn.execute(f"SET LOCAL maintenance_work_mem = '{int(megabytes)}MB'")


async def check_embedders(conn: Connection, embedder: EmbedderIdentity) -> None:
    """Refuse to start when an agent's stored vectors came from another embedder.

    An agent without any chunks yet is simply re-bound to the configured embedder.
    """
    rows = await conn.fetch(
        """SELECT a.id, a.slug, a.embedder, a.embedding_dim,
                  EXISTS (SELECT 1 FROM chunks c WHERE c.agent_id = a.id) AS has_chunks
             FROM agents a
            WHERE a.embedder IS DISTINCT FROM $1 OR a.embedding_dim IS DISTINCT FROM $2
            ORDER BY a.slug""",
        embedder.name,
        embedder.dimension,
    )
    stale = []
    for row in rows:
        if row["has_chunks"]:
            stale.append(row)
        else:
            await bind_embedder(conn, row["id"], embedder)
            log.info("store.embedder.bound agent=%s embedder=%s", row["slug"], embedder.name)
    if stale:
        first = stale[0]
        others = f" (and {len(stale) - 1} more agents)" if len(stale) > 1 else ""
        raise EmbedderMismatch(
            f"agent {first['slug']!r}{others} is indexed with {first['embedder']} "
            f"({first['embedding_dim']} dimensions) but the configured embedder is "
            f"{embedder.name} ({embedder.dimension} dimensions); run "
            f"`parley rebuild-index --agent {first['slug']}` to re-embed its content, "
            "or switch PARLEY_EMBED_PROVIDER / PARLEY_EMBED_MODEL back"
        )
