"""Each agent's HNSW index, built for the vector size of the embedder its content came from.

The `chunks.embedding` column has no fixed size, so agents on different embedders can live in
one table; each agent gets a partial index on ``(embedding::vector(N))`` restricted to its own
rows (pgvector's documented pattern). That also keeps an agent's ANN search from being diluted
by other agents' rows.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from core.errors import EmbedderMismatch
from core.ports import Embedder
from core.store.database import Connection

log = logging.getLogger(__name__)

# HNSW build parameters; see bench/retrieval.py for the recall they give.
HNSW_M = 16
HNSW_EF_CONSTRUCTION = 64


@dataclass(frozen=True, slots=True)
class EmbedderIdentity:
    """What an index was built with; vectors of two identities never mix in one index."""

    name: str  # "provider:model"
    dimension: int

    @classmethod
    def of(cls, embedder: Embedder) -> EmbedderIdentity:
        return cls(embedder.name, embedder.dimension)


def index_name(agent_id: int) -> str:
    return f"chunks_embedding_agent_{int(agent_id)}"


async def bind_embedder(conn: Connection, agent_id: int, embedder: EmbedderIdentity) -> None:
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
        # Identifiers and sizes are integers we made, never user text.
        await conn.execute(
            f"CREATE INDEX {name} ON chunks "
            f"USING hnsw ((embedding::vector({dim})) vector_cosine_ops) "
            f"WITH (m = {HNSW_M}, ef_construction = {HNSW_EF_CONSTRUCTION}) "
            f"WHERE agent_id = {int(agent_id)}"
        )


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
