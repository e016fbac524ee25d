"""The widget's "new conversation" in headless Chromium: the old session's memory is cleared."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from aiohttp.test_utils import TestServer
from playwright.async_api import expect

from core.knowledge.ingest import Ingestor
from core.knowledge.sources import parse_source
from core.retrieval.embedders import UseEmbedder
from core.settings import Settings
from core.store import Agents, Database
from core.store.knowledge import KnowledgeStore
from core.store.vector_index import EmbedderIdentity
from gateway.app import create_app
from gateway.demo import DemoSite
from tests.e2e.browser import ask, chromium, last_answer, open_chat, widget

PAGES = [
    {"url": "/en/products/fjord", "title": "Fjord GTX boot", "lang": "en",
     "text": "# Fjord GTX boot\nThe Fjord GTX is a waterproof leather hiking boot. "
             "Price: 189.95 euro. Colours: brown and blue."},
]  # fmt: skip
PAGE = '<!doctype html><html lang="en"><head><title>Shop</title></head><body><h1>Shop</h1>'


async def test_new_conversation_clears_the_old_sessions_memory(
    settings: Settings, database: Database, use_embedder: UseEmbedder, tmp_path: Path
) -> None:
    agents = Agents(database.pool)
    agent = await agents.create("shop", embedder=EmbedderIdentity.of(use_embedder))
    source = tmp_path / "pages.jsonl"
    source.write_text("\n".join(json.dumps(p) for p in PAGES), encoding="utf-8")
    await Ingestor(KnowledgeStore(database.pool), use_embedder).ingest(
        agent, parse_source(str(source))
    )
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text(PAGE + "</body></html>", encoding="utf-8")
    server = TestServer(create_app(settings, DemoSite(site, "shop", agent.widget_key)))
    await server.start_server()
    try:
        async with chromium() as browser:
            page = await browser.new_page()
            await page.goto(str(server.make_url("/")))
            await open_chat(page, "Open chat")
            await ask(page, "Is the Fjord GTX boot waterproof?")
            await expect(last_answer(page)).to_have_attribute("data-state", "done", timeout=30_000)
            old = await page.evaluate("window.ParleyWidget.sessionId")
            await widget(page).get_by_role("button", name="New conversation").click()
            assert await page.evaluate("window.ParleyWidget.sessionId") != old

            async def generation() -> int | None:
                value: int | None = await database.pool.fetchval(
                    "SELECT generation FROM conversations WHERE conversation_key = $1", old
                )
                return value

            async with asyncio.timeout(10):
                while await generation() != 1:
                    await asyncio.sleep(0.05)
    finally:
        await server.close()
    stored = await database.pool.fetchval(
        "SELECT count(*) FROM messages m JOIN conversations c ON c.id = m.conversation_id "
        "WHERE c.conversation_key = $1",
        old,
    )
    assert stored == 2  # kept for staff; only memory forgot them
