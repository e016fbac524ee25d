"""The agent's pages as a list to browse, and which of them hold some words: what exploring
the knowledge reads besides the pages' own text."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import asyncpg


@dataclass(frozen=True, slots=True)
class CatalogPage:
    id: int
    url: str
    title: str
    locale: str | None


def _like(literal: str) -> str:
    """``literal`` anywhere in a text, as an ILIKE pattern (its own % and _ are literal)."""
    escaped = literal.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


class PageCatalog:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def pages(
        self,
        agent_id: int,
        *,
        visibility: Sequence[str],
        include_tags: Sequence[str] = (),
        exclude_tags: Sequence[str] = (),
        limit: int = 5000,
    ) -> list[CatalogPage]:
        """The agent's pages that pass the filters (the same ones retrieval applies), by URL."""
        rows = await self._pool.fetch(
            """SELECT id, url, title, locale FROM pages
                WHERE agent_id = $1
                  AND visibility = ANY($2::text[])
                  AND (cardinality($3::text[]) = 0 OR tags && $3::text[])
                  AND NOT (tags && $4::text[])
                ORDER BY url, id
                LIMIT $5""",
            agent_id,
            list(visibility),
            list(include_tags),
            list(exclude_tags),
            limit,
        )
        return [CatalogPage(r["id"], r["url"], r["title"], r["locale"]) for r in rows]

    async def holding(
        self,
        agent_id: int,
        page_ids: Sequence[int],
        *,
        words: str,
        literals: Sequence[str],
        language: str | None,
        limit: int,
    ) -> list[int]:
        """Those of ``page_ids`` whose chunks share a stemmed word with ``words`` or contain
        one of ``literals`` (ignoring case), the best matching first."""
        rows = await self._pool.fetch(
            """WITH q AS (
                   SELECT string_agg(quote_literal(lexeme), ' | ')::tsquery AS query
                     FROM unnest(to_tsvector(parley_ts_config($3), $4))
               )
               SELECT c.page_id,
                      max(coalesce(ts_rank_cd(c.tsv, q.query), 0)
                          + CASE WHEN c.text ILIKE ANY($5::text[]) THEN 1 ELSE 0 END) AS rank
                 FROM chunks c CROSS JOIN q
                WHERE c.agent_id = $1 AND c.page_id = ANY($2::bigint[])
                  AND ((q.query IS NOT NULL AND c.tsv @@ q.query)
                       OR c.text ILIKE ANY($5::text[]) OR c.heading ILIKE ANY($5::text[]))
                GROUP BY c.page_id
                ORDER BY rank DESC, c.page_id
                LIMIT $6""",
            agent_id,
            list(page_ids),
            language,
            words,
            [_like(literal) for literal in literals],
            limit,
        )
        return [int(r["page_id"]) for r in rows]
