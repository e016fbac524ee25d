"""The optional reranker: it reorders and lifts the match; when it fails, fused scores stand."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from core.cache import LocalCache
from core.knowledge.ingest import Ingestor
from core.knowledge.sources import parse_source
from core.retrieval.embedders import UseEmbedder
from core.retrieval.rerank import HttpReranker
from core.retrieval.retriever import RetrievalQuery, RetrievalResult, Retriever
from core.store import Agents, Database
from core.store.knowledge import KnowledgeStore
from core.store.search import ChunkSearch
from core.store.vector_index import EmbedderIdentity
from tests.fakes.rerank import FakeReranker

PAGES = [
    {"url": "/returns", "title": "Returns", "text": "Return any item within 30 days for a refund."},
    {
        "url": "/exchanges",
        "title": "Exchanges",
        "text": "Exchange a size within 30 days, free of charge.",
    },
    {
        "url": "/shipping",
        "title": "Shipping",
        "text": "Parcels to Belgium arrive in 2-3 working days.",
    },
]


@pytest.fixture
async def agent_with_pages(
    database: Database, use_embedder: UseEmbedder, tmp_path: Path
) -> Database:
    await Agents(database.pool).create("shop", embedder=EmbedderIdentity.of(use_embedder))
    path = tmp_path / "pages.jsonl"
    path.write_text("\n".join(json.dumps(p) for p in PAGES), encoding="utf-8")
    agent = await Agents(database.pool).get("shop")
    await Ingestor(KnowledgeStore(database.pool), use_embedder).ingest(
        agent, parse_source(str(path))
    )
    return database


async def _ask(
    database: Database, embedder: UseEmbedder, fake: FakeReranker, question: str
) -> RetrievalResult:
    """Retrieve through a retriever whose reranker is the fake, served on a local port."""
    server = TestServer(fake.app())
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as session:
            reranker = HttpReranker(session, str(server.make_url("/rerank")))
            retriever = Retriever(ChunkSearch(database.pool), embedder, LocalCache(), reranker)
            agent = await Agents(database.pool).get("shop")
            return await retriever.retrieve(RetrievalQuery(agent=agent, text=question))
    finally:
        await server.close()


@pytest.mark.parametrize("style", ["tei", "jina"])
async def test_reranker_reorders_and_raises_the_match(
    agent_with_pages: Database, use_embedder: UseEmbedder, style: str
) -> None:
    fake = FakeReranker(keyword="Exchange", style=style)
    result = await _ask(agent_with_pages, use_embedder, fake, "Can I return my order?")
    assert fake.requests[0]["query"] == "Can I return my order?"
    top = result.ranked[0]
    assert top.url == "/exchanges"  # the reranker's choice wins the ranking
    assert top.rerank == pytest.approx(0.97)
    assert top.match == pytest.approx(0.97)  # max(ANN, rerank)
    assert top.dense < top.match


async def test_a_failing_reranker_falls_back_to_fused_scores(
    agent_with_pages: Database, use_embedder: UseEmbedder, caplog: pytest.LogCaptureFixture
) -> None:
    fake = FakeReranker(keyword="Exchange", status=503)
    result = await _ask(agent_with_pages, use_embedder, fake, "Can I return my order?")
    assert len(fake.requests) == 1
    assert result.ranked[0].url == "/returns"
    assert all(hit.rerank is None for hit in result.ranked)
    assert "retrieval.rerank.failed reason=reranker answered HTTP 503" in caplog.text
