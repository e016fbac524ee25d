"""Candidate generation in SQL: ANN over the agent's HNSW index and Postgres full-text search,
with visibility, tags and the language-folder rule applied in the same queries."""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg
import numpy as np
from numpy.typing import NDArray

from core.store.database import Connection

# Above this many candidates per request, HNSW's ef_search grows with the request.
_MIN_EF_SEARCH = 100
_MAX_EF_SEARCH = 1000


@dataclass(frozen=True, slots=True)
class SearchFilters:
    visibility: tuple[str, ...] = ("public",)
    include_tags: tuple[str, ...] = ()
    exclude_tags: tuple[str, ...] = ()
    # Pages under another language's folder are left out; None switches the rule off.
    folder_language: str | None = None


@dataclass(frozen=True, slots=True)
class Candidate:
    chunk_id: int
    page_id: int
    url: str
    title: str
    heading: str
    text: str
    locale: str | None
    page_type: str
    tags: tuple[str, ...]
    dense: float  # cosine similarity to the query
    lexical: float  # full-text rank in [0, 1), 0 when the words do not match
    # How nearly one heading (or title) or one sentence of the chunk is the query itself:
    # the Dice overlap of their distinct lexemes, 1.0 when word for word, 0 without a match.
    exactness: float = 0.0


_COLUMNS = """c.id AS chunk_id, c.page_id, p.url, p.title, c.heading, c.text, c.locale,
              c.page_type, c.tags"""

_FILTERS = """c.agent_id = $1
          AND c.visibility = ANY($3::text[])
          AND (cardinality($4::text[]) = 0 OR c.tags && $4::text[])
          AND NOT (c.tags && $5::text[])
          AND ($6::text IS NULL OR c.folder_language IS NULL OR c.folder_language = $6)"""


# A heading path is "Page title | Site > Section > Subsection": each part is a title of its
# own. Text splits into lines (list items, table rows, FAQ questions) and sentences.
_HEADING_PARTS = r"\s+[>|]\s+"
_SENTENCES = r"\n+|(?<=[.!?])\s+"


def _candidate(row: asyncpg.Record) -> Candidate:
    values = dict(row)
    values["tags"] = tuple(values["tags"])
    values["lexical"] = float(values.get("lexical") or 0.0)
    values["exactness"] = float(values.get("exactness") or 0.0)
    values["dense"] = float(values["dense"])
    return Candidate(**values)


class ChunkSearch:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    @staticmethod
    def _args(
        agent_id: int, vector: NDArray[np.float32], filters: SearchFilters
    ) -> tuple[object, ...]:
        return (
            agent_id,
            vector,
            list(filters.visibility),
            list(filters.include_tags),
            list(filters.exclude_tags),
            filters.folder_language,
        )

    async def dense(
        self,
        agent_id: int,
        dimension: int,
        vector: NDArray[np.float32],
        limit: int,
        filters: SearchFilters,
    ) -> list[Candidate]:
        """Nearest chunks by cosine distance through the agent's own HNSW index.

        pgvector 0.6 filters after the index scan, so a selective filter can leave fewer than
        ``limit`` rows; then an exact scan over the agent's rows answers instead.
        """
        dim = int(dimension)
        sql = f"""SELECT {_COLUMNS}, 1 - (c.embedding::vector({dim}) <=> $2) AS dense
                    FROM chunks c JOIN pages p ON p.id = c.page_id
                   WHERE {_FILTERS}
                   ORDER BY c.embedding::vector({dim}) <=> $2
                   LIMIT $7"""
        args = (*self._args(agent_id, vector, filters), limit)
        ef_search = min(_MAX_EF_SEARCH, max(_MIN_EF_SEARCH, 2 * limit))
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute(f"SET LOCAL hnsw.ef_search = {ef_search}")
            rows = await conn.fetch(sql, *args)
            if len(rows) < limit and await _has_more(conn, agent_id, len(rows)):
                await conn.execute("SET LOCAL enable_indexscan = off")
                rows = await conn.fetch(sql, *args)
        return [_candidate(r) for r in rows]

    async def lexical(
        self,
        agent_id: int,
        dimension: int,
        vector: NDArray[np.float32],
        query: str,
        language: str | None,
        limit: int,
        filters: SearchFilters,
    ) -> list[Candidate]:
        """Chunks sharing any stemmed word with the query, ranked by cover density.

        The words are OR-ed: visitors' questions are full sentences that no chunk matches
        word for word. The dense similarity is computed too, so fusion compares like with like.
        Each row also says how exactly the query is one of the chunk's headings or sentences:
        a question typed as it stands in an FAQ or a heading is its own best evidence, which
        the rank over the whole chunk does not show (a long chunk that repeats one of the
        words ranks as high).
        """
        dim = int(dimension)
        sql = f"""WITH q AS (
                      SELECT string_agg(quote_literal(lexeme), ' | ')::tsquery AS query,
                             array_agg(lexeme) AS lexemes
                        FROM unnest(to_tsvector(parley_ts_config($8), $9))
                  ), hits AS (
                      SELECT {_COLUMNS}, 1 - (c.embedding::vector({dim}) <=> $2) AS dense,
                             ts_rank_cd(c.tsv, q.query, 32) AS lexical
                        FROM q, chunks c JOIN pages p ON p.id = c.page_id
                       WHERE {_FILTERS} AND c.tsv @@ q.query
                       ORDER BY lexical DESC
                       LIMIT $7
                  )
                  SELECT h.*, coalesce(e.exactness, 0) AS exactness
                    FROM hits h CROSS JOIN q
                    LEFT JOIN LATERAL (
                      SELECT max(2.0 * cardinality(ARRAY(
                                     SELECT unnest(u.lexemes) INTERSECT SELECT unnest(q.lexemes)))
                                 / (cardinality(u.lexemes) + cardinality(q.lexemes))) AS exactness
                        FROM (SELECT tsvector_to_array(
                                         to_tsvector(parley_ts_config($8), part)) AS lexemes
                                FROM regexp_split_to_table(
                                         h.heading, '{_HEADING_PARTS}') AS part
                              UNION ALL
                              SELECT tsvector_to_array(
                                         to_tsvector(parley_ts_config($8), part))
                                FROM regexp_split_to_table(h.text, '{_SENTENCES}') AS part) u
                       WHERE cardinality(u.lexemes) > 0
                    ) e ON true
                   ORDER BY h.lexical DESC"""
        rows = await self._pool.fetch(
            sql, *self._args(agent_id, vector, filters), limit, language, query
        )
        return [_candidate(r) for r in rows]

    async def page_chunks(
        self, agent_id: int, page_ids: list[int]
    ) -> dict[int, list[tuple[str, str]]]:
        """Every chunk of the given pages as (heading path, text), in page order."""
        rows = await self._pool.fetch(
            """SELECT page_id, heading, text FROM chunks
                WHERE agent_id = $1 AND page_id = ANY($2::bigint[])
                ORDER BY page_id, id""",
            agent_id,
            page_ids,
        )
        out: dict[int, list[tuple[str, str]]] = {}
        for row in rows:
            out.setdefault(row["page_id"], []).append((row["heading"], row["text"]))
        return out

    async def page_at(
        self, agent_id: int, urls: list[str], visibility: tuple[str, ...]
    ) -> asyncpg.Record | None:
        """The indexed page at one of ``urls`` (the same address written differently)."""
        row: asyncpg.Record | None = await self._pool.fetchrow(
            """SELECT id, url, title, locale FROM pages
                WHERE agent_id = $1 AND url = ANY($2::text[]) AND visibility = ANY($3::text[])
                LIMIT 1""",
            agent_id,
            urls,
            list(visibility),
        )
        return row

    async def languages(self, agent_id: int) -> set[str]:
        """The languages the agent has pages in (by page locale)."""
        rows = await self._pool.fetch(
            """SELECT DISTINCT split_part(locale, '-', 1) AS language
                 FROM pages WHERE agent_id = $1 AND locale IS NOT NULL""",
            agent_id,
        )
        return {r["language"] for r in rows}


async def _has_more(conn: Connection, agent_id: int, found: int) -> bool:
    more: bool = await conn.fetchval(
        "SELECT count(*) > $2 FROM (SELECT 1 FROM chunks WHERE agent_id = $1 LIMIT $2 + 1) s",
        agent_id,
        found,
    )
    return more
