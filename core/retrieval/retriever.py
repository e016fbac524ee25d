"""Ranked, filtered, cached retrieval for one question: the part every answer depends on."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import asyncpg
import numpy as np
from numpy.typing import NDArray

from core.errors import Unavailable
from core.knowledge.pieces import page_text
from core.locale import detect_language, language_of
from core.ports import Cache, Embedder, Reranker
from core.retrieval.boosts import QuerySignals, boost_for
from core.retrieval.fusion import Fusion, fuse
from core.retrieval.rerank import HttpReranker
from core.settings import Settings
from core.store.agents import Agent
from core.store.search import Candidate, ChunkSearch, SearchFilters

log = logging.getLogger(__name__)

CACHE_TTL = 30 * 60
FAN_OUT = 5  # candidates fetched per list for every hit returned
RERANK_TOP = 20
LOW_CONFIDENCE_BELOW = 2  # survivors
Mode = Literal["hybrid", "dense", "lexical"]


@dataclass(frozen=True, slots=True)
class RetrievalQuery:
    agent: Agent
    text: str
    k: int = 8
    page_url: str | None = None
    reply_language: str | None = None
    visibility: tuple[str, ...] = ("public",)
    include_tags: tuple[str, ...] = ()
    exclude_tags: tuple[str, ...] = ()
    mode: Mode = "hybrid"
    fusion: Fusion = "calibrated"
    # False: every language folder may answer (a product only described in another language)
    language_folders: bool = True


@dataclass(frozen=True, slots=True)
class Hit:
    chunk_id: int
    page_id: int
    url: str
    title: str
    heading: str
    text: str
    locale: str | None
    page_type: str
    match: float  # max(ANN similarity, rerank score), before boosts: what "confidence" means
    dense: float
    lexical: float
    rerank: float | None
    boost: float
    score: float  # ranking score: fused (or reranked) + boosts
    reasons: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()  # the page's tags


@dataclass(frozen=True, slots=True)
class RetrievalResult:
    hits: tuple[Hit, ...]  # survivors of the threshold, best first, at most k
    ranked: tuple[Hit, ...]  # the k best by score whether or not they pass (for search, traces)
    low_confidence: bool
    confidence: float | None  # best pre-boost match among the candidates considered
    query_language: str | None
    folder_language: str | None
    timings_ms: dict[str, float] = field(default_factory=dict)
    cached: bool = False

    def pages(self, ranked: bool = False) -> list[Hit]:
        """The best hit of each page, in rank order (of the survivors, or of all ranked)."""
        seen: set[str] = set()
        best = []
        for hit in self.ranked if ranked else self.hits:
            if hit.url not in seen:
                seen.add(hit.url)
                best.append(hit)
        return best

    def to_json(self) -> str:
        # Field by field: dataclasses.asdict deep-copies every hit's text first, which cost
        # the event loop some 2-3 ms per search result cached, before the first token.
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["hits"] = [_hit_fields(h) for h in self.hits]
        data["ranked"] = [_hit_fields(h) for h in self.ranked]
        return json.dumps(data, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> RetrievalResult:
        data = json.loads(text)

        def hits(rows: list[dict[str, object]]) -> tuple[Hit, ...]:
            return tuple(
                Hit(**{**h, "reasons": tuple(h["reasons"]), "tags": tuple(h.get("tags", ()))})  # type: ignore[arg-type]
                for h in rows
            )

        return cls(
            hits=hits(data.pop("hits")), ranked=hits(data.pop("ranked")), **{**data, "cached": True}
        )


_HIT_FIELDS = tuple(f.name for f in dataclasses.fields(Hit))


def _hit_fields(hit: Hit) -> dict[str, object]:
    return {name: getattr(hit, name) for name in _HIT_FIELDS}


@dataclass(frozen=True, slots=True)
class PageRef:
    page_id: int
    url: str
    title: str
    locale: str | None


class Retriever:
    def __init__(
        self,
        search: ChunkSearch,
        embedder: Embedder,
        cache: Cache,
        reranker: Reranker | None = None,
    ) -> None:
        self._search = search
        self._embedder = embedder
        self._cache = cache
        self._reranker = reranker
        self._warming: set[asyncio.Task[object]] = set()

    async def retrieve(
        self, query: RetrievalQuery, vector: NDArray[np.float32] | None = None
    ) -> RetrievalResult:
        key = _cache_key(query)
        cached = await self._cache.get(key)
        if cached is not None:
            return RetrievalResult.from_json(cached)
        result = await self._retrieve(query, vector)
        await self._cache.set(key, result.to_json(), ttl=CACHE_TTL)
        return result

    async def page_texts(self, agent_id: int, page_ids: Sequence[int]) -> dict[int, str]:
        """The whole text of each page, its headings as Markdown lines: what an answer may
        quote when a retrieved chunk shows the page is the one that answers."""
        chunks = await self._search.page_chunks(agent_id, list(page_ids))
        return {page_id: page_text(parts) for page_id, parts in chunks.items()}

    async def page_at(self, agent: Agent, url: str) -> PageRef | None:
        """The public indexed page the visitor is on, whether the address is absolute or
        root-relative on either side."""
        parts = urlsplit(url)
        path = parts.path or "/"
        urls = list(dict.fromkeys([url, path, urlunsplit(parts._replace(query="", fragment=""))]))
        row = await self._search.page_at(agent.id, urls, ("public",))
        if row is None:
            return None
        return PageRef(row["id"], row["url"], row["title"], row["locale"])

    def warm(self, text: str) -> None:
        """Start embedding a question the search will soon be asked for: the embedder keeps
        its vector, so that it is ready then rather than made after whatever comes first."""
        task: asyncio.Task[object] = asyncio.get_running_loop().create_task(
            self._embedder.embed([text])
        )
        self._warming.add(task)
        task.add_done_callback(self._warmed)

    def _warmed(self, task: asyncio.Task[object]) -> None:
        self._warming.discard(task)
        failed = None if task.cancelled() else task.exception()
        if failed is not None:  # the search asks again, and handles the failure then
            log.debug("retrieval.warm.failed error=%s", type(failed).__name__)

    async def embed_queries(self, texts: Sequence[str]) -> NDArray[np.float32]:
        """Question vectors in one batch, for callers that retrieve many at once."""
        return await self._embedder.embed(list(texts))

    async def _retrieve(
        self, query: RetrievalQuery, vector: NDArray[np.float32] | None
    ) -> RetrievalResult:
        timings: dict[str, float] = {}
        started = time.perf_counter()
        agent = query.agent
        language = (
            language_of(query.reply_language)
            if query.reply_language
            else detect_language(query.text)
        )
        folder = await self._folder_language(agent, language) if query.language_folders else None
        filters = SearchFilters(
            visibility=query.visibility,
            include_tags=query.include_tags,
            exclude_tags=query.exclude_tags,
            folder_language=folder,
        )
        if vector is None:
            vector = (await self._embedder.embed([query.text]))[0]
        timings["embed"] = _ms(started)

        limit = max(query.k * FAN_OUT, 20)
        dimension = agent.embedding_dim or self._embedder.dimension
        step = time.perf_counter()
        dense_task = (
            self._search.dense(agent.id, dimension, vector, limit, filters)
            if query.mode != "lexical"
            else _nothing()
        )
        lexical_task = (
            self._search.lexical(agent.id, dimension, vector, query.text, language, limit, filters)
            if query.mode != "dense"
            else _nothing()
        )
        dense, lexical = await asyncio.gather(dense_task, lexical_task)
        timings["search"] = _ms(step)

        if query.mode == "dense":
            ranked = [(c, c.dense) for c in dense]
        elif query.mode == "lexical":
            ranked = [(c, c.lexical) for c in lexical]
        else:
            ranked = [(f.candidate, f.score) for f in fuse(dense, lexical, language, query.fusion)]

        step = time.perf_counter()
        reranked = await self._rerank(query.text, ranked[:RERANK_TOP])
        timings["rerank"] = _ms(step)

        hits = self._gate(query, ranked, reranked)
        hits.sort(key=lambda pair: pair[0].score, reverse=True)
        survivors = [h for h, passed in hits if passed]
        confidence = max((h.match for h, _ in hits), default=None)
        timings["total"] = _ms(started)
        return RetrievalResult(
            hits=tuple(survivors[: query.k]),
            ranked=tuple(h for h, _ in hits[: query.k]),
            low_confidence=len(survivors) < LOW_CONFIDENCE_BELOW,
            confidence=confidence,
            query_language=language,
            folder_language=folder,
            timings_ms=timings,
        )

    async def _folder_language(self, agent: Agent, language: str | None) -> str | None:
        """The language folder allowed for this reply language (see the language-folder rule)."""
        if language is None:
            return None
        if language in await self.languages(agent):
            return language
        return language_of(agent.default_language)

    async def languages(self, agent: Agent) -> set[str]:
        """The languages the agent's pages are written in (cached until its knowledge changes)."""
        key = f"languages:{agent.id}:{agent.knowledge_version}"
        cached = await self._cache.get(key)
        if cached is not None:
            return set(json.loads(cached))
        languages = await self._search.languages(agent.id)
        await self._cache.set(key, json.dumps(sorted(languages)), ttl=CACHE_TTL)
        return languages

    async def _rerank(
        self, question: str, ranked: list[tuple[Candidate, float]]
    ) -> dict[int, float]:
        if self._reranker is None or not ranked:
            return {}
        try:
            scores = await self._reranker.rerank(
                question, [f"{c.heading}\n{c.text}" for c, _ in ranked]
            )
        except Unavailable as exc:
            log.warning("retrieval.rerank.failed reason=%s", exc.message)
            return {}
        return {c.chunk_id: s for (c, _), s in zip(ranked, scores, strict=True)}

    def _gate(
        self,
        query: RetrievalQuery,
        ranked: list[tuple[Candidate, float]],
        reranked: dict[int, float],
    ) -> list[tuple[Hit, bool]]:
        """Score, boost and threshold every candidate; (hit, survived) in rank order."""
        signals = QuerySignals.of(query.text)
        threshold = query.agent.confidence_threshold
        out = []
        for candidate, fused in ranked:
            rerank = reranked.get(candidate.chunk_id)
            match = candidate.dense if rerank is None else max(candidate.dense, rerank)
            boost = boost_for(
                signals=signals,
                url=candidate.url,
                page_type=candidate.page_type,
                text=candidate.text,
                match=match,
                threshold=threshold,
                page_url=query.page_url,
            )
            base = fused if rerank is None else rerank
            hit = Hit(
                chunk_id=candidate.chunk_id,
                page_id=candidate.page_id,
                url=candidate.url,
                title=candidate.title,
                heading=candidate.heading,
                text=candidate.text,
                locale=candidate.locale,
                page_type=candidate.page_type,
                match=round(match, 4),
                dense=round(candidate.dense, 4),
                lexical=round(candidate.lexical, 4),
                rerank=None if rerank is None else round(rerank, 4),
                boost=round(boost.amount, 4),
                score=round(base + boost.amount, 4),
                reasons=boost.reasons,
                tags=candidate.tags,
            )
            out.append((hit, match + boost.amount >= boost.threshold))
        return out


async def _nothing() -> list[Candidate]:
    return []


def _ms(since: float) -> float:
    return round((time.perf_counter() - since) * 1000, 2)


def _cache_key(query: RetrievalQuery) -> str:
    params = [
        query.text.strip(),
        query.k,
        query.page_url,
        query.reply_language,
        query.visibility,
        query.include_tags,
        query.exclude_tags,
        query.mode,
        query.fusion,
        query.language_folders,
        query.agent.confidence_threshold,
    ]
    digest = hashlib.sha256(json.dumps(params, default=list).encode()).hexdigest()[:32]
    return f"retrieval:{query.agent.id}:{query.agent.knowledge_version}:{digest}"


def build_retriever(
    settings: Settings,
    pool: asyncpg.Pool,
    embedder: Embedder,
    cache: Cache,
    session: aiohttp.ClientSession,
) -> Retriever:
    """The retriever the settings describe (with the reranker when one is configured)."""
    reranker = HttpReranker(session, settings.rerank_url) if settings.rerank_url else None
    return Retriever(ChunkSearch(pool), embedder, cache, reranker)
