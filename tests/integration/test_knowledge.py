"""Ingestion and retrieval on real PostgreSQL + pgvector, Redis and the bundled embedder."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from core.cache import RedisCache
from core.knowledge.ingest import Ingestor
from core.knowledge.sources import parse_source
from core.retrieval.embedders import UseEmbedder
from core.retrieval.retriever import RetrievalQuery, Retriever
from core.store import Agent, Agents, Database
from core.store.knowledge import KnowledgeStore
from core.store.search import ChunkSearch
from core.store.vector_index import EmbedderIdentity
from tests.support.services import LOOPBACK, free_port


@dataclass
class Kit:
    database: Database
    agents: Agents
    store: KnowledgeStore
    ingestor: Ingestor
    retriever: Retriever

    async def agent(self, slug: str) -> Agent:
        return await self.agents.get(slug)

    async def ingest(self, slug: str, source: Path | str, **kwargs: str) -> object:
        return await self.ingestor.ingest(
            await self.agent(slug), parse_source(str(source)), **kwargs
        )

    async def search(self, slug: str, text: str, **kwargs: object) -> list[str]:
        query = RetrievalQuery(agent=await self.agent(slug), text=text, **kwargs)  # type: ignore[arg-type]
        return [hit.url for hit in (await self.retriever.retrieve(query)).pages()]


@pytest.fixture
async def kit(
    database: Database, use_embedder: UseEmbedder, cache: RedisCache
) -> AsyncIterator[Kit]:
    agents = Agents(database.pool)
    store = KnowledgeStore(database.pool)
    retriever = Retriever(ChunkSearch(database.pool), use_embedder, cache)
    return Kit(database, agents, store, Ingestor(store, use_embedder), retriever)


def write(root: Path, relative: str, text: str) -> Path:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


SHIPPING_EN = """# Shipping

## Delivery times
Orders to the Netherlands arrive in 1-2 working days. Belgium takes 2-3 working days.

## Costs
Shipping costs 4.95 euro; orders above 50 euro ship free.
"""
SHIPPING_NL = """# Verzending

## Levertijden
Bestellingen in Nederland komen binnen 1-2 werkdagen aan. België duurt 2-3 werkdagen.

## Kosten
Verzending kost 4,95 euro; bestellingen boven 50 euro worden gratis verzonden.
"""
RETURNS_EN = """# Returns
You can return any item within 30 days. Return shipping is free with the label in the box.
Refunds arrive within 5 working days after we receive the parcel.
"""
WARRANTY = """# Warranty
All jackets carry a two-year warranty against manufacturing defects. Send a photo of the defect
to service@noordkaap.example to make a claim.
"""


async def test_ingest_is_idempotent_and_detects_changes(
    kit: Kit, tmp_path: Path, use_embedder: UseEmbedder
) -> None:
    await kit.agents.create("shop", embedder=EmbedderIdentity.of(use_embedder))
    site = tmp_path / "site"
    write(site, "en/shipping.md", SHIPPING_EN)
    write(site, "en/returns.md", RETURNS_EN)

    first = await kit.ingest("shop", site)
    assert (first.added, first.updated, first.unchanged, first.removed) == (2, 0, 0, 0)  # type: ignore[attr-defined]
    assert first.chunks_embedded > 0  # type: ignore[attr-defined]
    version = (await kit.agent("shop")).knowledge_version
    assert version == 1

    again = await kit.ingest("shop", site)
    assert (again.added, again.updated, again.unchanged, again.chunks_embedded) == (0, 0, 2, 0)  # type: ignore[attr-defined]
    assert (await kit.agent("shop")).knowledge_version == version  # nothing changed

    chunks_before = await kit.database.pool.fetch(
        "SELECT c.id FROM chunks c JOIN pages p ON p.id = c.page_id WHERE p.url = '/en/returns.md'"
    )
    write(site, "en/returns.md", RETURNS_EN.replace("30 days", "60 days"))
    changed = await kit.ingest("shop", site)
    assert (changed.added, changed.updated, changed.unchanged) == (0, 1, 1)  # type: ignore[attr-defined]
    texts = await kit.database.pool.fetch(
        "SELECT c.id, c.text FROM chunks c JOIN pages p ON p.id = c.page_id WHERE p.url = '/en/returns.md'"
    )
    assert {r["id"] for r in texts}.isdisjoint({r["id"] for r in chunks_before})  # replaced
    assert any("60 days" in r["text"] for r in texts)
    assert not any("30 days" in r["text"] for r in texts)
    assert (await kit.agent("shop")).knowledge_version == version + 1

    (site / "en/returns.md").unlink()
    removed = await kit.ingest("shop", site)
    assert removed.removed == 1  # type: ignore[attr-defined]
    urls = {r["url"] for r in await kit.database.pool.fetch("SELECT url FROM pages")}
    assert urls == {"/en/shipping.md"}
    assert (
        await kit.database.pool.fetchval(
            "SELECT count(*) FROM chunks c JOIN pages p ON p.id = c.page_id WHERE p.url = '/en/returns.md'"
        )
        == 0
    )


async def test_removing_a_source_removes_its_pages(
    kit: Kit, tmp_path: Path, use_embedder: UseEmbedder
) -> None:
    await kit.agents.create("shop", embedder=EmbedderIdentity.of(use_embedder))
    write(tmp_path / "a", "shipping.md", SHIPPING_EN)
    write(tmp_path / "b", "warranty.md", WARRANTY)
    await kit.ingest("shop", tmp_path / "a")
    report = await kit.ingest("shop", tmp_path / "b")
    removed = await kit.store.remove_source((await kit.agent("shop")).id, report.source_id)  # type: ignore[attr-defined]
    assert removed == 1
    assert "/warranty.md" not in await kit.search("shop", "How long is the warranty on jackets?")
    urls = {r["url"] for r in await kit.database.pool.fetch("SELECT url FROM pages")}
    assert urls == {"/shipping.md"}


async def test_language_folder_rule(kit: Kit, tmp_path: Path, use_embedder: UseEmbedder) -> None:
    await kit.agents.create("shop", embedder=EmbedderIdentity.of(use_embedder), language="en")
    site = tmp_path / "site"
    write(site, "en/shipping.md", SHIPPING_EN)
    write(site, "nl/verzending.md", SHIPPING_NL)
    write(site, "warranty.md", WARRANTY)  # no language folder
    await kit.ingest("shop", site)

    dutch = await kit.search("shop", "Hoe lang duurt de levering naar België?", reply_language="nl")
    assert dutch[0] == "/nl/verzending.md"
    assert "/en/shipping.md" not in dutch  # another language's folder is left out
    english = await kit.search(
        "shop", "How long does delivery to Belgium take?", reply_language="en"
    )
    assert english[0] == "/en/shipping.md"
    assert "/nl/verzending.md" not in english
    # A page without a language folder serves every language.
    garantie = await kit.search("shop", "Hoe lang is de garantie op jassen?", reply_language="nl")
    assert garantie[0] == "/warranty.md"


async def test_an_english_only_agent_answers_a_dutch_question(
    kit: Kit, tmp_path: Path, use_embedder: UseEmbedder
) -> None:
    await kit.agents.create("shop", embedder=EmbedderIdentity.of(use_embedder), language="en")
    site = tmp_path / "site"
    write(site, "en/shipping.md", SHIPPING_EN)
    write(site, "en/returns.md", RETURNS_EN)
    await kit.ingest("shop", site)
    pages = await kit.search(
        "shop", "Binnen hoeveel dagen kan ik iets terugsturen?", reply_language="nl"
    )
    assert pages[0] == "/en/returns.md"


async def _ingest_jsonl(kit: Kit, tmp_path: Path, rows: list[dict[str, object]]) -> object:
    path = tmp_path / "pages.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    return await kit.ingest("shop", path)


async def test_internal_pages_never_reach_a_public_channel(
    kit: Kit, tmp_path: Path, use_embedder: UseEmbedder
) -> None:
    await kit.agents.create("shop", embedder=EmbedderIdentity.of(use_embedder))
    await _ingest_jsonl(
        kit,
        tmp_path,
        [
            {"url": "https://shop.example/returns", "title": "Returns", "text": RETURNS_EN},
            {
                "url": "https://intranet.example/refund-exceptions",
                "title": "Refund exceptions (staff)",
                "text": "Staff may refund returns after 30 days for loyal customers with manager approval.",
                "visibility": "internal",
            },
        ],
    )
    public = await kit.search("shop", "Can I get a refund after 30 days?")
    assert "https://intranet.example/refund-exceptions" not in public
    assert public == ["https://shop.example/returns"]
    staff = await kit.search(
        "shop", "Can I get a refund after 30 days?", visibility=("public", "internal")
    )
    assert "https://intranet.example/refund-exceptions" in staff


async def test_tags_include_and_exclude(
    kit: Kit, tmp_path: Path, use_embedder: UseEmbedder
) -> None:
    await kit.agents.create("shop", embedder=EmbedderIdentity.of(use_embedder))
    await _ingest_jsonl(
        kit,
        tmp_path,
        [
            {"url": "/b2c/returns", "title": "Returns", "text": RETURNS_EN, "tags": ["consumer"]},
            {
                "url": "/b2b/returns",
                "title": "Returns for business customers",
                "text": "Business customers can return goods within 14 days; a 10% restocking fee applies.",
                "tags": ["business"],
            },
        ],
    )
    question = "How many days do I have to return an item?"
    assert set(await kit.search("shop", question)) == {"/b2c/returns", "/b2b/returns"}
    assert await kit.search("shop", question, include_tags=("business",)) == ["/b2b/returns"]
    assert await kit.search("shop", question, exclude_tags=("business",)) == ["/b2c/returns"]


async def test_threshold_low_confidence_and_match_ignores_boosts(
    kit: Kit, tmp_path: Path, use_embedder: UseEmbedder
) -> None:
    await kit.agents.create("shop", embedder=EmbedderIdentity.of(use_embedder))
    await _ingest_jsonl(
        kit,
        tmp_path,
        [
            {"url": "/shipping", "title": "Shipping", "text": SHIPPING_EN, "page_type": "policy"},
            {"url": "/returns", "title": "Returns", "text": RETURNS_EN, "page_type": "policy"},
            {
                "url": "/p/nk-2041",
                "title": "Fjord hiking boot",
                "page_type": "product",
                "text": "The Fjord hiking boot (NK-2041) is a waterproof leather boot for long hikes.",
            },
        ],
    )
    agent = await kit.agent("shop")
    unrelated = await kit.retriever.retrieve(
        RetrievalQuery(agent=agent, text="Who won the football world cup in 1974?")
    )
    assert unrelated.hits == ()
    assert unrelated.low_confidence
    assert unrelated.confidence is not None
    assert unrelated.confidence < agent.confidence_threshold

    coded = await kit.retriever.retrieve(RetrievalQuery(agent=agent, text="Is NK-2041 waterproof?"))
    top = coded.hits[0]
    assert top.url == "/p/nk-2041"
    assert "product_code" in top.reasons
    assert top.boost >= 1.0
    assert top.match == top.dense  # the recorded match is the pre-boost similarity
    assert top.match < 1.0
    assert top.score >= top.match + 1.0


async def test_cached_results_are_purged_by_a_reingest(
    kit: Kit, tmp_path: Path, use_embedder: UseEmbedder
) -> None:
    await kit.agents.create("shop", embedder=EmbedderIdentity.of(use_embedder))
    site = tmp_path / "site"
    write(site, "returns.md", RETURNS_EN)
    await kit.ingest("shop", site)
    question = RetrievalQuery(agent=await kit.agent("shop"), text="How long do refunds take?")
    first = await kit.retriever.retrieve(question)
    assert not first.cached
    assert (await kit.retriever.retrieve(question)).cached
    assert "5 working days" in first.hits[0].text

    write(site, "returns.md", RETURNS_EN.replace("5 working days", "10 working days"))
    await kit.ingest("shop", site)
    fresh = await kit.retriever.retrieve(
        RetrievalQuery(agent=await kit.agent("shop"), text="How long do refunds take?")
    )
    assert not fresh.cached
    assert "10 working days" in fresh.hits[0].text


async def test_bad_input_is_reported_and_the_rest_ingested(
    kit: Kit, tmp_path: Path, use_embedder: UseEmbedder
) -> None:
    await kit.agents.create("shop", embedder=EmbedderIdentity.of(use_embedder))
    site = tmp_path / "site"
    write(site, "returns.md", RETURNS_EN)
    broken = site / "latin1.txt"
    broken.write_bytes("Caf\xe9 cr\xe8me".encode("latin-1"))
    report = await kit.ingest("shop", site)
    assert report.added == 1  # type: ignore[attr-defined]
    assert [(e.location, e.reason) for e in report.errors] == [
        (str(broken), "not UTF-8 text (byte 3)")
    ]  # type: ignore[attr-defined]

    lines = tmp_path / "pages.jsonl"
    lines.write_text(
        json.dumps({"url": "/a", "title": "A", "text": SHIPPING_EN})
        + "\n"
        + "{not json\n"
        + json.dumps({"url": "/c", "title": "C"})
        + "\n"
        + json.dumps({"url": "/d", "title": "D", "text": WARRANTY, "visibility": "secret"})
        + "\n",
        encoding="utf-8",
    )
    report = await kit.ingest("shop", lines)
    assert report.added == 1  # type: ignore[attr-defined]
    located = [(e.location, e.reason) for e in report.errors]  # type: ignore[attr-defined]
    assert located[0][0] == f"{lines}:2"
    assert located[0][1].startswith("invalid JSON")
    assert located[1] == (f"{lines}:3", "text: Field required")
    assert located[2][0] == f"{lines}:4"
    assert located[2][1].startswith("visibility:")
    sources = await kit.store.list_sources((await kit.agent("shop")).id)
    jsonl = next(s for s in sources if s.kind == "jsonl")
    assert jsonl.status == "ready"
    assert jsonl.last_error is not None
    assert "pages.jsonl:2" in jsonl.last_error


async def test_an_unreachable_url_is_recorded_on_the_source(
    kit: Kit, use_embedder: UseEmbedder
) -> None:

    await kit.agents.create("shop", embedder=EmbedderIdentity.of(use_embedder))
    url = f"http://127.0.0.1:{free_port()}/"
    ingestor = Ingestor(kit.store, use_embedder, allow_networks=LOOPBACK)
    report = await ingestor.ingest(await kit.agent("shop"), parse_source(url))
    assert report.failed is not None
    [source] = await kit.store.list_sources((await kit.agent("shop")).id)
    assert source.status == "failed"
    assert source.location == url
    assert source.last_error is not None
    assert "connect" in source.last_error.lower()
    assert (await kit.agent("shop")).knowledge_version == 0


def _site_app(requests: list[str]) -> web.Application:
    """A tiny shop: robots.txt, a sitemap, two pages with ETags, chrome around the content."""
    pages = {
        "/en/shipping": ("Shipping", SHIPPING_EN, '"v1"'),
        "/en/returns": ("Returns", RETURNS_EN, '"v7"'),
    }

    async def page(request: web.Request) -> web.StreamResponse:
        requests.append(
            f"{request.method} {request.path} {request.headers.get('If-None-Match', '-')}"
        )
        title, text, etag = pages[request.path]
        if request.headers.get("If-None-Match") == etag:
            return web.Response(status=304, headers={"ETag": etag})
        paragraphs = "".join(
            f"<h2>{line[3:]}</h2>" if line.startswith("## ") else f"<p>{line}</p>"
            for line in text.splitlines()[1:]
            if line.strip()
        )
        body = (
            f'<html lang="en"><head><title>{title}</title></head><body>'
            '<nav><a href="/en/shipping">Shipping</a> <a href="/en/returns">Returns</a></nav>'
            '<div class="cookie-banner">We use cookies. Accept all cookies?</div>'
            f"<main><h1>{title}</h1>{paragraphs}</main>"
            "<footer>Noordkaap Outdoor, all rights reserved</footer></body></html>"
        )
        return web.Response(text=body, content_type="text/html", headers={"ETag": etag})

    async def robots(request: web.Request) -> web.Response:
        return web.Response(
            text=f"User-agent: *\nAllow: /\nSitemap: {request.url.origin()}/sitemap.xml\n"
        )

    async def sitemap(request: web.Request) -> web.Response:
        urls = "".join(f"<url><loc>{request.url.origin()}{path}</loc></url>" for path in pages)
        return web.Response(
            text=f'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{urls}</urlset>',
            content_type="application/xml",
        )

    app = web.Application()
    app.router.add_get("/robots.txt", robots)
    app.router.add_get("/sitemap.xml", sitemap)
    for path in pages:
        app.router.add_get(path, page)
    return app


async def test_crawled_site_is_ingested_and_unchanged_pages_cost_nothing(
    kit: Kit, use_embedder: UseEmbedder
) -> None:
    await kit.agents.create("shop", embedder=EmbedderIdentity.of(use_embedder))
    requests: list[str] = []
    server = TestServer(_site_app(requests))
    await server.start_server()
    try:
        ingestor = Ingestor(kit.store, use_embedder, allow_networks=LOOPBACK)
        start = str(server.make_url("/"))
        first = await ingestor.ingest(await kit.agent("shop"), parse_source(start))
        again = await ingestor.ingest(await kit.agent("shop"), parse_source(start))
    finally:
        await server.close()
    assert (first.added, first.errors) == (2, [])
    texts = [r["text"] for r in await kit.database.pool.fetch("SELECT text FROM chunks")]
    assert any("2-3 working days" in t for t in texts)
    assert not any("cookies" in t or "rights reserved" in t for t in texts)  # chrome stripped
    assert (again.added, again.updated, again.unchanged, again.chunks_embedded) == (0, 0, 2, 0)
    assert 'GET /en/shipping "v1"' in requests  # the second run asked conditionally
    pages = await kit.search("shop", "How long does delivery to Belgium take?", reply_language="en")
    assert pages[0].endswith("/en/shipping")


async def test_a_site_on_a_private_address_is_refused_and_nothing_indexed(
    kit: Kit, use_embedder: UseEmbedder
) -> None:
    await kit.agents.create("shop", embedder=EmbedderIdentity.of(use_embedder))
    requests: list[str] = []
    server = TestServer(_site_app(requests))
    await server.start_server()
    try:
        start = str(server.make_url("/"))
        # no allow-list: what a deployment has unless it names its intranet
        report = await Ingestor(kit.store, use_embedder).ingest(
            await kit.agent("shop"), parse_source(start)
        )
    finally:
        await server.close()
    assert requests == []
    assert report.added == 0
    assert report.failed is not None
    [source] = await kit.store.list_sources((await kit.agent("shop")).id)
    assert source.status == "failed"
    assert source.last_error == f"{start}: refused: private address"
    assert await kit.database.pool.fetchval("SELECT count(*) FROM chunks") == 0
    assert (await kit.agent("shop")).knowledge_version == 0
