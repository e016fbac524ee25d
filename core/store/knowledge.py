"""Sources, pages and chunks: the SQL behind ingestion and index rebuilds."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

import asyncpg
import numpy as np
from numpy.typing import NDArray

from core.documents import Chunk, Document
from core.errors import Conflict, NotFound
from core.locale import language_of, locale_from_url
from core.store.database import Connection
from core.store.piece_vectors import PagePieces, write_pieces
from core.store.vector_index import EmbedderIdentity, bind_embedder, index_name


@dataclass(frozen=True, slots=True)
class SourceRecord:
    id: int
    agent_id: int
    kind: str
    location: str
    status: str
    last_crawled_at: datetime | None
    last_error: str | None
    pages: int
    tags: tuple[str, ...] = ()  # given to every page read from it

    @classmethod
    def from_row(cls, row: asyncpg.Record) -> SourceRecord:
        return cls(**{**dict(row), "tags": tuple(row["tags"])})


@dataclass(frozen=True, slots=True)
class PageRecord:
    """A page as staff see it: the tags it carries, and which of them are its own."""

    id: int
    source_id: int
    url: str
    title: str
    tags: tuple[str, ...]  # its own, its source's and the agent's URL rules'
    own_tags: tuple[str, ...]  # as staff set them, else as its source gave them
    own_tags_edited: bool  # staff set them: a re-read of the source keeps them
    fetched_at: datetime

    @classmethod
    def from_row(cls, row: asyncpg.Record) -> PageRecord:
        return cls(**{**dict(row), "tags": tuple(row["tags"]), "own_tags": tuple(row["own_tags"])})


_SOURCE = """SELECT s.id, s.agent_id, s.kind, s.location, s.status, s.last_crawled_at,
                    s.last_error, (SELECT count(*) FROM pages p WHERE p.source_id = s.id) AS pages,
                    s.tags
               FROM sources s"""
_PAGE = """SELECT id, source_id, url, title, tags, coalesce(staff_tags, own_tags) AS own_tags,
                  staff_tags IS NOT NULL AS own_tags_edited, fetched_at
             FROM pages"""
# Every page's tags (and its chunks') made anew from its own, its source's and its agent's
# URL rules, in one statement; only pages whose tags change are written. Narrowed to one
# source ($2) or one page ($3) when given; the number of pages changed comes back.
_RETAG = """
    WITH next AS (
        SELECT p.id,
               parley_page_tags(p.url, coalesce(p.staff_tags, p.own_tags), s.tags,
                                (SELECT a.settings -> 'tag_rules' FROM agents a WHERE a.id = $1))
                   AS tags
          FROM pages p JOIN sources s ON s.id = p.source_id
         WHERE p.agent_id = $1
           AND ($2::bigint IS NULL OR p.source_id = $2)
           AND ($3::bigint IS NULL OR p.id = $3)),
    changed AS (
        UPDATE pages p SET tags = next.tags FROM next
         WHERE p.id = next.id AND p.tags <> next.tags
        RETURNING p.id, p.tags),
    chunks_changed AS (
        UPDATE chunks c SET tags = changed.tags FROM changed
         WHERE c.page_id = changed.id AND c.tags <> changed.tags)
    SELECT count(*) FROM changed"""


@dataclass(frozen=True, slots=True)
class StoredPage:
    id: int
    source_id: int
    content_hash: bytes
    etag: str | None
    last_modified: str | None


def folder_language(url: str) -> str | None:
    folder = locale_from_url(url)
    return language_of(folder) if folder else None


class KnowledgeStore:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def upsert_source(self, agent_id: int, kind: str, location: str) -> int:
        """The id of the agent's source at ``location``, made on first use.

        Looked up before anything is inserted: an insert that meets the existing row still
        draws an id from the sequence, and a source tried again and again would leave its
        list of sources with gaps that look like rows come and gone."""
        for _ in range(3):
            source_id: int | None = await self._pool.fetchval(
                """WITH made AS (
                       INSERT INTO sources (agent_id, kind, location)
                       SELECT $1, $2, $3
                        WHERE NOT EXISTS (SELECT 1 FROM sources
                                           WHERE agent_id = $1 AND kind = $2 AND location = $3)
                       ON CONFLICT (agent_id, kind, location) DO NOTHING
                       RETURNING id)
                   SELECT id FROM made
                   UNION ALL
                   SELECT id FROM sources WHERE agent_id = $1 AND kind = $2 AND location = $3
                   LIMIT 1""",
                agent_id,
                kind,
                location,
            )
            if source_id is not None:
                return source_id
            # Made by another process after this statement's snapshot: the next one sees it.
        raise Conflict(f"source {location} is being changed by another process; try again")

    async def set_source_status(self, source_id: int, status: str, error: str | None) -> None:
        await self._pool.execute(
            """UPDATE sources SET status = $2, last_error = $3,
                      last_crawled_at = CASE WHEN $2 IN ('ready', 'failed') THEN now()
                                             ELSE last_crawled_at END
                WHERE id = $1""",
            source_id,
            status,
            error,
        )

    async def list_sources(self, agent_id: int) -> list[SourceRecord]:
        rows = await self._pool.fetch(f"{_SOURCE} WHERE s.agent_id = $1 ORDER BY s.id", agent_id)
        return [SourceRecord.from_row(r) for r in rows]

    async def get_source(self, agent_id: int, source_id: int) -> SourceRecord:
        row = await self._pool.fetchrow(
            f"{_SOURCE} WHERE s.agent_id = $1 AND s.id = $2", agent_id, source_id
        )
        if row is None:
            raise NotFound(f"no source {source_id} for this agent")
        return SourceRecord.from_row(row)

    async def set_source_tags(self, agent_id: int, source_id: int, tags: Sequence[str]) -> int:
        """Give the source these tags, and its pages and their chunks at once; returns the
        number of pages whose tags changed (the knowledge version moves when any did)."""
        async with self._pool.acquire() as conn, conn.transaction():
            updated = await conn.execute(
                "UPDATE sources SET tags = $3 WHERE id = $2 AND agent_id = $1",
                agent_id,
                source_id,
                list(tags),
            )
            if updated == "UPDATE 0":
                raise NotFound(f"no source {source_id} for this agent")
            return await _retag(conn, agent_id, source_id=source_id)

    async def list_pages(
        self, agent_id: int, source_id: int, *, after: int = 0, limit: int = 100
    ) -> list[PageRecord]:
        """The source's pages by id, from the first after ``after``."""
        rows = await self._pool.fetch(
            f"""{_PAGE} WHERE agent_id = $1 AND source_id = $2 AND id > $3
                 ORDER BY id LIMIT $4""",
            agent_id,
            source_id,
            after,
            limit,
        )
        return [PageRecord.from_row(r) for r in rows]

    async def set_page_tags(
        self, agent_id: int, page_id: int, tags: Sequence[str] | None
    ) -> PageRecord:
        """Staff's own tags for a page (None: those its source gives it again); the page's
        chunks carry the result in the same transaction."""
        async with self._pool.acquire() as conn, conn.transaction():
            updated = await conn.execute(
                "UPDATE pages SET staff_tags = $3 WHERE id = $2 AND agent_id = $1",
                agent_id,
                page_id,
                None if tags is None else list(tags),
            )
            if updated == "UPDATE 0":
                raise NotFound(f"no page {page_id} for this agent")
            await _retag(conn, agent_id, page_id=page_id)
            row = await conn.fetchrow(f"{_PAGE} WHERE id = $1", page_id)
        assert row is not None
        return PageRecord.from_row(row)

    async def retag(self, agent_id: int, *, source_id: int | None = None) -> int:
        """Make the tags of the agent's pages (or one source's) anew, after its URL rules
        changed or a source was read again; returns the number of pages changed."""
        async with self._pool.acquire() as conn, conn.transaction():
            return await _retag(conn, agent_id, source_id=source_id)

    async def save_text(self, agent_id: int, url: str, text: str) -> int:
        """A source of pasted text, kept with it so that it can be indexed again."""
        source_id: int = await self._pool.fetchval(
            """INSERT INTO sources (agent_id, kind, location, content) VALUES ($1, 'text', $2, $3)
               ON CONFLICT (agent_id, kind, location) DO UPDATE SET content = EXCLUDED.content
               RETURNING id""",
            agent_id,
            url,
            text,
        )
        return source_id

    async def source_text(self, source_id: int) -> str | None:
        text: str | None = await self._pool.fetchval(
            "SELECT content FROM sources WHERE id = $1", source_id
        )
        return text

    async def remove_source(self, agent_id: int, source_id: int) -> int:
        """Delete a source with its pages and chunks; returns the number of pages removed."""
        async with self._pool.acquire() as conn, conn.transaction():
            pages = await conn.fetchval(
                "SELECT count(*) FROM pages WHERE source_id = $1", source_id
            )
            deleted = await conn.execute(
                "DELETE FROM sources WHERE id = $1 AND agent_id = $2", source_id, agent_id
            )
            if deleted == "DELETE 0":
                raise NotFound(f"no source {source_id} for this agent")
            await bump_knowledge_version(conn, agent_id)
        return int(pages)

    async def stored_pages(self, agent_id: int) -> dict[str, StoredPage]:
        rows = await self._pool.fetch(
            """SELECT url, id, source_id, content_hash, etag, last_modified
                 FROM pages WHERE agent_id = $1""",
            agent_id,
        )
        return {r["url"]: StoredPage(**{k: v for k, v in r.items() if k != "url"}) for r in rows}

    async def write_page(
        self,
        agent_id: int,
        source_id: int,
        doc: Document,
        chunks: Sequence[Chunk],
        vectors: NDArray[np.float32],
        pieces: PagePieces | None = None,
    ) -> None:
        """Insert or replace a page, all its chunks and its pieces' vectors in one
        transaction."""
        folder = folder_language(doc.url)
        async with self._pool.acquire() as conn, conn.transaction():
            page_id, tags = await _upsert_page(conn, agent_id, source_id, doc)
            await write_pieces(conn, page_id, pieces)
            await conn.execute("DELETE FROM chunks WHERE page_id = $1", page_id)
            await conn.copy_records_to_table(
                "chunks",
                columns=[
                    "agent_id",
                    "page_id",
                    "ord",
                    "heading",
                    "text",
                    "locale",
                    "visibility",
                    "tags",
                    "page_type",
                    "embedding",
                    "folder_language",
                ],
                records=[
                    (
                        agent_id,
                        page_id,
                        chunk.ord,
                        chunk.heading,
                        chunk.text,
                        doc.locale,
                        doc.visibility,
                        tags,
                        doc.page_type,
                        vector,
                        folder,
                    )
                    for chunk, vector in zip(chunks, vectors, strict=True)
                ],
            )

    async def piece_vectors(self, page_ids: Sequence[int], embedder: str) -> dict[bytes, bytes]:
        """The stored piece vectors of these pages made by ``embedder``, as stored, by digest."""
        if not page_ids:
            return {}
        rows = await self._pool.fetch(
            """SELECT digest, vector FROM piece_vectors
                WHERE page_id = ANY($1::bigint[]) AND embedder = $2""",
            list(page_ids),
            embedder,
        )
        return {r["digest"]: r["vector"] for r in rows}

    async def page_parts(
        self, agent_id: int, *, after: int = 0, limit: int = 50
    ) -> list[tuple[int, list[tuple[str, str]]]]:
        """The agent's pages by id, from the first after ``after``, each with its chunks as
        (heading path, text) in page order."""
        rows = await self._pool.fetch(
            """SELECT c.page_id, c.heading, c.text FROM chunks c
                WHERE c.page_id IN (SELECT id FROM pages WHERE agent_id = $1 AND id > $2
                                     ORDER BY id LIMIT $3)
                ORDER BY c.page_id, c.id""",
            agent_id,
            after,
            limit,
        )
        pages: dict[int, list[tuple[str, str]]] = {}
        for row in rows:
            pages.setdefault(row["page_id"], []).append((row["heading"], row["text"]))
        return list(pages.items())

    async def touch_page(self, agent_id: int, source_id: int, doc: Document) -> None:
        """An unchanged page: keep its chunks, refresh validators and ownership."""
        await self._pool.execute(
            """UPDATE pages SET source_id = $3, etag = $4, last_modified = $5, fetched_at = now()
                WHERE agent_id = $1 AND url = $2""",
            agent_id,
            doc.url,
            source_id,
            doc.etag,
            doc.last_modified,
        )

    async def prune(self, source_id: int, keep: Iterable[str]) -> int:
        """Delete this source's pages whose URLs were not seen in the latest read."""
        result = await self._pool.execute(
            "DELETE FROM pages WHERE source_id = $1 AND NOT (url = ANY($2::text[]))",
            source_id,
            list(keep),
        )
        return int(result.split()[-1])

    async def count_chunks(self, agent_id: int) -> int:
        count: int = await self._pool.fetchval(
            "SELECT count(*) FROM chunks WHERE agent_id = $1", agent_id
        )
        return count

    async def bump_version(self, agent_id: int) -> int:
        async with self._pool.acquire() as conn:
            return await bump_knowledge_version(conn, agent_id)


async def _upsert_page(
    conn: Connection, agent_id: int, source_id: int, doc: Document
) -> tuple[int, list[str]]:
    """The page's id, and the tags it carries: its own (``doc.tags``, unless staff set them),
    its source's and those of the agent's URL rules it matches."""
    row = await conn.fetchrow(
        """INSERT INTO pages (agent_id, source_id, url, title, locale, visibility, own_tags,
                              tags, page_type, product, content_hash, etag, last_modified)
           VALUES ($1, $2, $3, $4, $5, $6, $7,
                   parley_page_tags($3, $7, (SELECT tags FROM sources WHERE id = $2),
                                    (SELECT settings -> 'tag_rules' FROM agents WHERE id = $1)),
                   $8, $9, $10, $11, $12)
           ON CONFLICT (agent_id, url) DO UPDATE SET
               source_id = EXCLUDED.source_id, title = EXCLUDED.title,
               locale = EXCLUDED.locale, visibility = EXCLUDED.visibility,
               own_tags = EXCLUDED.own_tags,
               tags = parley_page_tags(
                   EXCLUDED.url, coalesce(pages.staff_tags, EXCLUDED.own_tags),
                   (SELECT tags FROM sources WHERE id = EXCLUDED.source_id),
                   (SELECT settings -> 'tag_rules' FROM agents WHERE id = EXCLUDED.agent_id)),
               page_type = EXCLUDED.page_type,
               product = EXCLUDED.product, content_hash = EXCLUDED.content_hash,
               etag = EXCLUDED.etag, last_modified = EXCLUDED.last_modified,
               fetched_at = now()
           RETURNING id, tags""",
        agent_id,
        source_id,
        doc.url,
        doc.title,
        doc.locale,
        doc.visibility,
        list(doc.tags),
        doc.page_type,
        dict(doc.product) if doc.product is not None else None,
        doc.content_hash,
        doc.etag,
        doc.last_modified,
    )
    assert row is not None
    return row["id"], list(row["tags"])


async def _retag(
    conn: Connection, agent_id: int, *, source_id: int | None = None, page_id: int | None = None
) -> int:
    """`_RETAG` on ``conn``; the knowledge version moves when a page's tags changed."""
    changed: int = await conn.fetchval(_RETAG, agent_id, source_id, page_id)
    if changed:
        await bump_knowledge_version(conn, agent_id)
    return changed


async def bump_knowledge_version(conn: Connection, agent_id: int) -> int:
    """Every knowledge change moves the version, which every retrieval cache key contains."""
    version: int = await conn.fetchval(
        """UPDATE agents SET knowledge_version = knowledge_version + 1, updated_at = now()
            WHERE id = $1 RETURNING knowledge_version""",
        agent_id,
    )
    return version


# The vectors chunks are found by (`core.knowledge.chunk.embed_chunks` with the embedder).
EmbedFn = Callable[[list[Chunk]], Awaitable[NDArray[np.float32]]]


async def reembed_agent(
    pool: asyncpg.Pool,
    agent_id: int,
    embedder: EmbedderIdentity,
    embed: EmbedFn,
    *,
    batch: int = 256,
    on_batch: Callable[[int], None] | None = None,
) -> int:
    """Re-embed every chunk of an agent and rebuild its index, all in one transaction.

    Until the commit, searches keep using the old vectors; a failure leaves them untouched.
    Returns the number of chunks re-embedded.
    """
    done = 0
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(f"DROP INDEX IF EXISTS {index_name(agent_id)}")
        last = 0
        while True:
            rows = await conn.fetch(
                """SELECT id, heading, text FROM chunks
                    WHERE agent_id = $1 AND id > $2 ORDER BY id LIMIT $3""",
                agent_id,
                last,
                batch,
            )
            if not rows:
                break
            vectors = await embed([Chunk(0, r["heading"], r["text"]) for r in rows])
            await conn.executemany(
                "UPDATE chunks SET embedding = $2 WHERE id = $1",
                [(r["id"], v) for r, v in zip(rows, vectors, strict=True)],
            )
            last = rows[-1]["id"]
            done += len(rows)
            if on_batch:
                on_batch(len(rows))
        # The pieces' vectors of another embedder are no use now (`fill_piece_vectors`
        # makes them anew; until then a turn encodes what it quotes).
        await conn.execute(
            """DELETE FROM piece_vectors v USING pages p
                WHERE p.id = v.page_id AND p.agent_id = $1 AND v.embedder <> $2""",
            agent_id,
            embedder.name,
        )
        await bind_embedder(conn, agent_id, embedder)
        await bump_knowledge_version(conn, agent_id)
    return done
