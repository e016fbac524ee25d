"""Candidate generation in SQL: ANN over the agent's HNSW index and Postgres full-text search,
with visibility, tags and the language-folder rule applied in the same queries."""

from __future__ import annotations

import time
from dataclasses import dataclass

import asyncpg
import numpy as np
from numpy.typing import NDArray

from core.store.vector_index import EF_SEARCH, INDEX_PREFIX, EfSearch

# Full-text candidates: a word that stands in more than LEXICAL_BUDGET of the agent's chunks
# (estimated from the column statistics ANALYZE keeps) still counts towards a chunk's rank,
# but does not bring in candidates by itself: ranking every chunk that says "order" in a big
# shop costs a rank computation each, and such a chunk says no more about the question
# than the rarer words do. When every word of the question is that common, chunks holding
# them all are the candidates. LEXICAL_CAP bounds the ranked set in any case.
LEXICAL_BUDGET = 2_000
LEXICAL_CAP = 10_000
# A tag filter usually keeps few rows, and those are spread over the whole space rather than
# near one another: the HNSW scan then walks far through the graph for them, and its later,
# relaxed-order rounds miss some of the nearest. When the tags are expected on at most
# EXACT_TAG_ROWS of the agent's chunks (column statistics again), those chunks are found
# through the tags index and ranked exactly instead; above that the iterative scan answers,
# asked for TAG_OVERFETCH times the rows so that the nearest of them can be kept.
EXACT_TAG_ROWS = 25_000
TAG_OVERFETCH = 4
# How long (s) an agent's index size, which its ef_search follows (EfSearch), is taken as
# known: an agent that grows past EfSearch.large_from gets the large list within a minute.
SIZE_TTL = 60.0


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

# How many chunks the agent has, as of the last build or vacuum of its vector index (the
# table's own count when it has none): lexeme shares are turned into chunk counts with it.
_AGENT_CHUNKS = f"""SELECT coalesce(
                      (SELECT nullif(reltuples, -1) FROM pg_class
                        WHERE oid = to_regclass('{INDEX_PREFIX}' || $1::bigint)),
                      (SELECT greatest(reltuples, 0) FROM pg_class WHERE oid = 'chunks'::regclass)
                    ) AS chunks"""

# The share of chunks each of the most common lexemes stands in, from ANALYZE's statistics
# of chunks.tsv (frequencies of the most common elements); a lexeme not listed is rarer.
_LEXEME_SHARES = """SELECT e.lexeme, e.share
                      FROM pg_stats st,
                           unnest(st.most_common_elems::text::text[],
                                  st.most_common_elem_freqs) AS e(lexeme, share)
                     WHERE st.schemaname = current_schema() AND st.tablename = 'chunks'
                       AND st.attname = 'tsv'"""

# Likewise for the tags on chunks.
_TAG_SHARES = """SELECT e.tag, e.share
                   FROM pg_stats st,
                        unnest(st.most_common_elems::text::text[],
                               st.most_common_elem_freqs) AS e(tag, share)
                  WHERE st.schemaname = current_schema() AND st.tablename = 'chunks'
                    AND st.attname = 'tags'"""

_FILTERS = """c.agent_id = $1
          AND c.visibility = ANY($3::text[])
          AND (cardinality($4::text[]) = 0 OR c.tags && $4::text[])
          AND NOT (c.tags && $5::text[])
          AND ($6::text IS NULL OR c.folder_language IS NULL OR c.folder_language = $6)"""


# A heading path is "Page title | Site > Section > Subsection": each part is a title of its
# own. Text splits into lines (list items, table rows, FAQ questions) and sentences.
_HEADING_PARTS = r"\s+[>|]\s+"
# Exactness is the Dice overlap 2|u & q| / (|u| + |q|) of a heading or sentence u with the
# query q. From EXACT_FROM on, u counts as the query itself (3 of 4 words, or a heading with
# one word more than the query; see core.retrieval.fusion). That takes
# |u & q| >= EXACT_SHARE |q| (0.6), and u's words are among its chunk's: a chunk holding
# fewer of the query's words (stemmed alike, the same language) cannot reach EXACT_FROM, and
# its sentences are not looked at.
EXACT_FROM = 0.75
EXACT_SHARE = EXACT_FROM / (2 - EXACT_FROM)
_SENTENCES = r"\n+|(?<=[.!?])\s+"


def _candidate(row: asyncpg.Record) -> Candidate:
    values = dict(row)
    values["tags"] = tuple(values["tags"])
    values["lexical"] = float(values.get("lexical") or 0.0)
    values["exactness"] = float(values.get("exactness") or 0.0)
    values["dense"] = float(values["dense"])
    return Candidate(**values)


class ChunkSearch:
    def __init__(self, pool: asyncpg.Pool, ef_search: EfSearch = EF_SEARCH) -> None:
        """``pool``'s connections start with ``ef_search.small`` (`hnsw_session`)."""
        self._pool = pool
        self._ef_search = ef_search
        self._lists: dict[int, tuple[float, int]] = {}  # agent -> (known until, list)

    async def ef_search(self, agent_id: int) -> int:
        """The HNSW candidate list the agent's index size calls for."""
        known = self._lists.get(agent_id)
        if known is None or known[0] <= time.monotonic():
            chunks = await self._pool.fetchval(_AGENT_CHUNKS, agent_id)
            known = (time.monotonic() + SIZE_TTL, self._ef_search.for_chunks(chunks or 0))
            self._lists[agent_id] = known
        return known[1]

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
        """Nearest permitted chunks by cosine distance, through the agent's own HNSW index.

        The filters are applied during the index scan, which goes on (iteratively) past
        rows they exclude; see `hnsw_session`. Tag filters: see EXACT_TAG_ROWS. The graph
        search's candidate list follows the size of the agent's index (EfSearch).
        """
        dim = int(dimension)
        distance = f"c.embedding::halfvec({dim}) <=> $2"
        args = (*self._args(agent_id, vector, filters), limit)
        if not filters.include_tags:
            sql = f"""SELECT {_COLUMNS}, 1 - ({distance}) AS dense
                        FROM chunks c JOIN pages p ON p.id = c.page_id
                       WHERE {_FILTERS}
                       ORDER BY {distance}
                       LIMIT $7"""
        else:
            # Only the branch the estimate picks runs. "+ 0" keeps the exact branch off the
            # HNSW index: it sorts the rows the tags index found.
            sql = f"""WITH tagged AS (
                          SELECT coalesce(sum(e.share), 0) * n.chunks AS expected
                            FROM ({_AGENT_CHUNKS}) n
                            LEFT JOIN ({_TAG_SHARES}) e ON e.tag = ANY($4::text[])
                           GROUP BY n.chunks
                      )
                      (SELECT {_COLUMNS}, 1 - ({distance}) AS dense
                         FROM chunks c JOIN pages p ON p.id = c.page_id
                        WHERE {_FILTERS}
                          AND (SELECT expected FROM tagged) <= {EXACT_TAG_ROWS}
                        ORDER BY ({distance}) + 0
                        LIMIT $7)
                      UNION ALL
                      (SELECT {_COLUMNS}, 1 - ({distance}) AS dense
                         FROM chunks c JOIN pages p ON p.id = c.page_id
                        WHERE {_FILTERS}
                          AND (SELECT expected FROM tagged) > {EXACT_TAG_ROWS}
                        ORDER BY {distance}
                        LIMIT $7 * {TAG_OVERFETCH})"""
        ef_search = await self.ef_search(agent_id)
        if ef_search == self._ef_search.small:
            rows = await self._pool.fetch(sql, *args)
        else:
            async with self._pool.acquire() as conn, conn.transaction():
                await conn.execute(f"SET LOCAL hnsw.ef_search = {int(ef_search)}")
                rows = await conn.fetch(sql, *args)
        # Relaxed order: a row found by a later round of the iterative scan may come before
        # a nearer one from an earlier round.
        found = sorted((_candidate(r) for r in rows), key=lambda c: c.dense, reverse=True)
        return found[:limit]

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
        word for word. Only the words that are not common bring in candidates (see
        LEXICAL_BUDGET), and only the best-ranked candidates are read whole: their page, and
        their dense similarity, so fusion compares like with like.
        Each row also says how exactly the query is one of the chunk's headings or sentences:
        a question typed as it stands in an FAQ or a heading is its own best evidence, which
        the rank over the whole chunk does not show (a long chunk that repeats one of the
        words ranks as high). Splitting and stemming every sentence is most of the query's
        work, so it is done only for a chunk that holds EXACT_SHARE of the query's words;
        the others are given 0 (see EXACT_SHARE).
        """
        dim = int(dimension)
        sql = f"""WITH words AS (
                      SELECT w.lexeme, coalesce(s.share, 0) * n.chunks AS expected
                        FROM unnest(to_tsvector(parley_ts_config($8), $9)) w
                        CROSS JOIN ({_AGENT_CHUNKS}) n
                        LEFT JOIN ({_LEXEME_SHARES}) s ON s.lexeme = w.lexeme
                  ), q AS (
                      SELECT string_agg(quote_literal(lexeme), ' | ')::tsquery AS query,
                             coalesce(
                               string_agg(quote_literal(lexeme), ' | ')
                                 FILTER (WHERE expected <= {LEXICAL_BUDGET}),
                               string_agg(quote_literal(lexeme), ' & '))::tsquery AS candidates,
                             array_agg(lexeme) AS lexemes
                        FROM words
                  ), ranked AS (
                      SELECT m.id, ts_rank_cd(m.tsv, q.query, 32) AS lexical
                        FROM q, LATERAL (
                          SELECT c.id, c.tsv FROM chunks c
                           WHERE {_FILTERS} AND c.tsv @@ q.candidates
                           LIMIT {LEXICAL_CAP}) m
                       ORDER BY lexical DESC
                       LIMIT $7
                  ), hits AS (
                      SELECT {_COLUMNS}, 1 - (c.embedding::halfvec({dim}) <=> $2) AS dense,
                             r.lexical,
                             parley_ts_config(c.locale) <> parley_ts_config($8)
                               OR (SELECT count(*) FROM unnest(q.lexemes) l
                                    WHERE c.tsv @@ quote_literal(l)::tsquery)
                                  >= {EXACT_SHARE} * cardinality(q.lexemes) AS may_be_exact
                        FROM ranked r JOIN chunks c ON c.id = r.id JOIN pages p ON p.id = c.page_id
                        CROSS JOIN q
                  )
                  SELECT h.chunk_id, h.page_id, h.url, h.title, h.heading, h.text, h.locale,
                         h.page_type, h.tags, h.dense, h.lexical,
                         CASE WHEN h.may_be_exact THEN coalesce((
                           SELECT max(2.0 * cardinality(ARRAY(
                                      SELECT unnest(u.lexemes) INTERSECT SELECT unnest(q.lexemes)))
                                  / (cardinality(u.lexemes) + cardinality(q.lexemes)))
                             FROM (SELECT tsvector_to_array(
                                          to_tsvector(parley_ts_config($8), part)) AS lexemes
                                     FROM regexp_split_to_table(
                                          h.heading, '{_HEADING_PARTS}') AS part
                                   UNION ALL
                                   SELECT tsvector_to_array(
                                          to_tsvector(parley_ts_config($8), part))
                                     FROM regexp_split_to_table(h.text, '{_SENTENCES}') AS part) u
                            WHERE cardinality(u.lexemes) > 0), 0) ELSE 0 END AS exactness
                    FROM hits h CROSS JOIN q
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
