"""Human handoff in headless Chromium: the open widget shows staff replies as they are sent."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer
from playwright.async_api import Browser, Page, expect

from core.handoff import Handoff
from core.knowledge.ingest import Ingestor
from core.knowledge.sources import parse_source
from core.retrieval.embedders import UseEmbedder
from core.store import Agents, Database
from core.store.knowledge import KnowledgeStore
from core.store.vector_index import EmbedderIdentity
from gateway.app import create_app
from gateway.demo import DEMO_SITE, DemoSite
from gateway.keys import HANDOFF
from tests.conftest import MakeSettings
from tests.e2e.browser import ask, chromium, last_answer, open_chat, widget

PAGE = "/nl/retourneren.html"
PAGES = [
    {"url": "/nl/retourneren", "title": "Retourneren", "lang": "nl",
     "text": "# Retourneren\nJe kunt elk artikel binnen 30 dagen retourneren. "
             "Het geld staat binnen 5 werkdagen op je rekening."},
]  # fmt: skip


@dataclass
class Shop:
    url: str
    database: Database
    handoff: Handoff  # the staff's gateway: another app on the same database


@pytest.fixture
async def shop(
    make_settings: MakeSettings, database: Database, use_embedder: UseEmbedder, tmp_path: Path
) -> AsyncIterator[Shop]:
    agents = Agents(database.pool)
    agent = await agents.create("shop", embedder=EmbedderIdentity.of(use_embedder))
    path = tmp_path / "pages.jsonl"
    path.write_text("\n".join(json.dumps(p) for p in PAGES), encoding="utf-8")
    await Ingestor(KnowledgeStore(database.pool), use_embedder).ingest(
        agent, parse_source(str(path))
    )
    settings = make_settings()
    visitors = TestServer(create_app(settings, DemoSite(DEMO_SITE, "shop", agent.widget_key)))
    staff = TestServer(create_app(settings))
    await visitors.start_server()
    await staff.start_server()
    try:
        yield Shop(str(visitors.make_url("")).rstrip("/"), database, staff.app[HANDOFF])
    finally:
        await visitors.close()
        await staff.close()


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with chromium() as launched:
        yield launched


async def _conversation(shop: Shop, page: Page) -> int:
    session = await page.evaluate("localStorage.getItem('parley:shop:session')")
    found: int = await shop.database.pool.fetchval(
        "SELECT id FROM conversations WHERE channel = 'web' AND conversation_key = $1", session
    )
    return found


async def test_the_open_widget_shows_a_person_joining_and_their_replies(
    shop: Shop, browser: Browser
) -> None:
    page = await browser.new_page(viewport={"width": 1280, "height": 800})
    await page.goto(shop.url + PAGE)
    await open_chat(page)
    await ask(page, "Hoe lang heb ik om iets te retourneren?")
    await expect(last_answer(page)).to_have_attribute("data-state", "done")
    await expect(last_answer(page)).to_contain_text("30 dagen")
    conversation = await _conversation(shop, page)
    chat = widget(page)

    await shop.handoff.take_over(conversation, "anna")
    await expect(chat.locator(".note")).to_have_text(
        "Een medewerker van ons team neemt nu deel aan het gesprek."
    )
    await expect(chat.get_by_role("heading", name="In gesprek met ons team")).to_be_visible()

    await shop.handoff.reply(conversation, "Hallo, met Anna!\nWaarmee kan ik helpen?", "anna")
    staff = chat.locator(".msg.staff")
    await expect(staff).to_have_count(1)
    await expect(staff).to_contain_text("Klantenservice")
    await expect(staff).to_contain_text("Hallo, met Anna!")

    # The bot keeps quiet: the question waits for Anna, and no answer bubble appears.
    await ask(page, "Ik wil mijn jas ruilen")
    await expect(chat.locator(".msg.user")).to_have_count(2)
    await expect(chat.locator(".msg.bot:not(.greeting)")).to_have_count(1)  # its bubble went

    await shop.handoff.reply(conversation, "Dat kan! Ik stuur je een label.", "anna")
    await expect(staff).to_have_count(2)

    # Closed: a reply still arrives while staff have the conversation, and marks the launcher.
    await chat.get_by_role("button", name="Chat sluiten").first.click()
    await shop.handoff.reply(conversation, "Het label staat in je mail.", "anna")
    await expect(chat.locator(".launcher.unread")).to_have_count(1)

    await shop.handoff.hand_back(conversation)
    await open_chat(page)
    await expect(chat.locator(".note").last).to_have_text("Je chat weer met de assistent.")
    await expect(chat.get_by_role("heading", name="Stel een vraag")).to_be_visible()

    # After a reload the conversation is as it was, with nothing shown twice.
    await page.reload()
    await open_chat(page)
    await expect(chat.locator(".msg.staff")).to_have_count(3)
    await expect(chat.locator(".note")).to_have_count(2)
    await ask(page, "Hoe snel krijg ik mijn geld terug?")
    await expect(last_answer(page)).to_contain_text("5 werkdagen")
